"""Prometheus metrics read from the engine at scrape time (no counters kept on the side).

Two audiences. Kubernetes LLM routers (the Gateway API Inference Extension's endpoint picker, llm-d,
KServe) schedule by the model-server protocol's metrics, which this module exposes with vLLM's
types and meanings under our own names (EPP_METRIC_FLAGS maps the picker's flags to them;
docs/KUBERNETES.md): requests waiting and running, KV-cache usage as a fraction, the LoRA info
gauge, the cache config; and, as vLLM, time-to-first-token, inter-token and end-to-end latency
histograms and preemptions. Operators get adapter residency besides: GPU slots and the host cache,
as totals; which adapter sits where is per tenant and unbounded in number, so it is no label here:
each tenant reads its own in GET /v1/engine/status.

The LoRA info gauge (`loraloom_lora_requests_info`) is one series whose value is the scrape's Unix
time (the picker keeps the series with the latest value) and whose labels are vLLM's: `max_lora`
(GPU adapter slots), `running_lora_adapters` and `waiting_lora_adapters` (comma-separated adapter
names of the running and waiting requests). An adapter is named as AdapterHandle.name: `name@N` for
a registry version, the checkpoint id, or the server-local adapter's name. Those are what a request
may send as `model` to get exactly those weights, so a router matching a request's `model` against
these lists finds the replicas that hold them; a request naming an alias (`name:prod`) or a bare
name matches once an InferenceModelRewrite (or the client) pins it to `name@N`. Names are
tenant-scoped and the router is tenant-blind: two tenants' `support-bot@3` share one entry, which
costs at most a misplaced affinity, never access (the gateway in the pod still authorizes).

Per-tenant metrics carry one label, `tenant` (its name), one series per tenant that used the engine
(tenants are made by the operator, so they are bounded): requests queued and running, tokens served
(prompt + output), and the fair-share counter (engine/fair_share.py: served tokens / weight, plus the
lifts that keep idle time from being banked). Two counters far apart while both tenants queue mean the
fair share is not holding; a tenant's counter far below the others' with requests queued is starved.

Per-adapter metrics carry two labels: `tenant` (the name of the tenant whose requests they count,
as the API shows it) and `adapter` (the name the request resolved to: `name@N` for a registry
version, a checkpoint id, a server-local adapter's name, or `base`), so two tenants' adapters of
the same name move different series. The running and waiting gauges list only pairs with requests in
flight; the requests counter is bounded as the histograms below are.

Speculative decoding's counters (`loraloom_spec_decode_num_drafts`, `_num_draft_tokens`,
`_num_accepted_tokens`, `_num_emitted_tokens`: vLLM's names) carry the same `tenant` and `model` labels,
so each adapter's acceptance rate is one division.

The latency histograms (time to first token, inter-token, end to end) and the finished-requests
counter (`loraloom_requests_finished_total`, by `finished_reason`: stop, length, abort, error) carry
`tenant` and `model` (base, or the adapter as above), so an operator reads one adapter's p95. Their
number is bounded by the engine (engine/metric_labels.py): past `serve --metrics-max-adapters`
adapters, further ones count under their tenant as model="other". The requests counter uses the
same labels under the same cap.

Under Ray Serve (several engine replicas behind one gateway) the router-protocol gauges above stay
one series, the replicas summed, since a router schedules this gateway's endpoint as one server;
every other family has a `replica` label (Ray Serve's replica id), one series per live replica.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loraloom.engine import EngineStats
from loraloom.platform.metering.replica_stats import sum_stats

ADAPTER_LABELS = ["tenant", "adapter"]  # the order of EngineStats' per-adapter keys
LATENCY_LABELS = ["tenant", "model"]  # the order of the latency histograms' and finished requests' keys
REQUESTS_FINISHED = "loraloom_requests_finished"

REQUESTS_WAITING = "loraloom_requests_waiting"
REQUESTS_RUNNING = "loraloom_requests_running"
KV_CACHE_USAGE = "loraloom_kv_cache_usage_ratio"
LORA_INFO = "loraloom_lora_requests_info"
CACHE_CONFIG_INFO = "loraloom_cache_config_info"
LORA_INFO_LABELS = ["max_lora", "running_lora_adapters", "waiting_lora_adapters"]  # vLLM's, which the picker reads

# The endpoint picker's flag -> the metric of ours it must read (its defaults name vLLM's metrics).
# deploy/kubernetes/ passes exactly these; tests/deploy checks that they agree with what we expose.
EPP_METRIC_FLAGS = {
    "total-queued-requests-metric": REQUESTS_WAITING,
    "total-running-requests-metric": REQUESTS_RUNNING,
    "kv-cache-usage-percentage-metric": KV_CACHE_USAGE,
    "lora-info-metric": LORA_INFO,
    "cache-info-metric": CACHE_CONFIG_INFO,
}


ReadReplicas = Callable[[], dict[str, EngineStats]]


class EngineStatsCollector(Collector):
    """`read_stats`: the engine's stats. `read_replicas`, for an engine client over several replicas
    (platform/ray_serve): each replica's stats by its id; the router-protocol gauges then report the
    replicas summed (what a router scheduling this gateway's endpoint reads), and every other family
    one series per replica, under a `replica` label, so one replica's latency or load is not averaged
    away into the others'."""

    def __init__(self, read_stats: Callable[[], EngineStats], read_replicas: ReadReplicas | None = None) -> None:
        self.read_stats = read_stats
        self.read_replicas = read_replicas

    def collect(self) -> Iterator[Metric]:
        if self.read_replicas is None:
            stats = self.read_stats()
            readings: list[tuple[list[str], EngineStats]] = [([], stats)]
            replica_label: list[str] = []
        else:
            replicas = self.read_replicas()
            stats = sum_stats(list(replicas.values()))
            readings = [([replica], one) for replica, one in sorted(replicas.items())]
            replica_label = ["replica"]
        yield from _router_protocol(stats)
        yield from _per_replica(readings, replica_label)


def _router_protocol(stats: EngineStats) -> Iterator[Metric]:
    yield GaugeMetricFamily(REQUESTS_RUNNING, "Requests being generated now.", value=stats.num_running)
    yield GaugeMetricFamily(REQUESTS_WAITING, "Requests queued for admission.", value=stats.num_waiting)
    yield GaugeMetricFamily(
        KV_CACHE_USAGE, "Fraction of KV cache blocks held by requests (0 to 1).", value=stats.kv_cache_usage
    )
    yield _lora_info(stats)
    cache_config = GaugeMetricFamily(CACHE_CONFIG_INFO, "The KV cache's configuration (value 1).",
                                     labels=["block_size", "num_gpu_blocks"])
    cache_config.add_metric([str(stats.block_size), str(stats.kv_blocks_total)], 1)
    yield cache_config


# Engine-wide counts: (family, name, help, the EngineStats field).
_ENGINE_TOTALS = (
    (CounterMetricFamily, "loraloom_preemptions", "Requests preempted (their KV freed, recomputed later).",
     "preemptions_total"),
    (GaugeMetricFamily, "loraloom_kv_blocks_used", "KV cache blocks referenced by requests.", "kv_blocks_used"),
    (GaugeMetricFamily, "loraloom_kv_blocks_cached", "Unreferenced KV blocks kept for prefix reuse.", "kv_blocks_cached"),
    (GaugeMetricFamily, "loraloom_kv_blocks_total", "KV cache blocks in the pool.", "kv_blocks_total"),
    (GaugeMetricFamily, "loraloom_adapter_slots_used", "GPU adapter slots holding an adapter.", "adapter_slots_used"),
    (GaugeMetricFamily, "loraloom_adapter_slots_total", "GPU adapter slots (max_loras).", "adapter_slots_total"),
    (CounterMetricFamily, "loraloom_prompt_tokens", "Prompt tokens of admitted requests.", "prompt_tokens_total"),
    (CounterMetricFamily, "loraloom_generation_tokens", "Tokens generated.", "generation_tokens_total"),
    # Where adapters are: the host cache, and the traffic between it and the GPU slots.
    (GaugeMetricFamily, "loraloom_host_cache_adapters", "Adapters whose weights the host cache holds.",
     "host_cache_adapters"),
    (GaugeMetricFamily, "loraloom_host_cache_bytes", "Host memory the cached adapter weights take.", "host_cache_bytes"),
    (GaugeMetricFamily, "loraloom_host_cache_capacity", "Adapters the host cache keeps (not counting held ones).",
     "host_cache_capacity"),
    (CounterMetricFamily, "loraloom_host_cache_hits", "Adapter lookups answered from host memory.",
     "host_cache_hits_total"),
    (CounterMetricFamily, "loraloom_host_cache_misses", "Adapter lookups that fetched from storage.",
     "host_cache_misses_total"),
    (CounterMetricFamily, "loraloom_host_cache_evictions", "Adapters dropped from host memory for room.",
     "host_cache_evictions_total"),
    (CounterMetricFamily, "loraloom_adapter_slot_loads", "Adapters copied into a GPU slot.", "adapter_slot_loads_total"),
    (CounterMetricFamily, "loraloom_adapter_slot_evictions", "GPU slot loads that replaced another adapter.",
     "adapter_slot_evictions_total"),
    (GaugeMetricFamily, "loraloom_spec_decode_store_tokens",
     "Tokens of recent answers kept to propose drafts from (per tenant and adapter, never shared).",
     "spec_decode_store_tokens"),
    (GaugeMetricFamily, "loraloom_spec_decode_store_bytes", "Memory those answers and their index take (an estimate).",
     "spec_decode_store_bytes"),
)
_PER_TENANT = (
    (GaugeMetricFamily, "loraloom_tenant_requests_waiting", "Requests queued for admission, per tenant.",
     "queued_per_tenant"),
    (GaugeMetricFamily, "loraloom_tenant_requests_running", "Requests being generated, per tenant.", "running_per_tenant"),
    (CounterMetricFamily, "loraloom_tenant_served_tokens", "Tokens served (prompt + output), per tenant.",
     "served_tokens_per_tenant"),
    (GaugeMetricFamily, "loraloom_tenant_share_counter",
     "Fair-share virtual token counter (served tokens / weight, plus lifts), per tenant.", "share_counter_per_tenant"),
)
_PER_ADAPTER = (
    (GaugeMetricFamily, "loraloom_adapter_requests_running", "Requests being generated, per adapter.",
     "running_per_adapter"),
    (GaugeMetricFamily, "loraloom_adapter_requests_waiting", "Requests queued, per adapter.", "waiting_per_adapter"),
    (CounterMetricFamily, "loraloom_adapter_requests", "Requests received, per adapter.", "requests_per_adapter_total"),
)
# Speculative decoding (engine/speculation/), vLLM's names, per (tenant, model) as the latencies: acceptance
# per adapter is accepted_tokens / draft_tokens, tokens per verified draft emitted_tokens / drafts.
_SPECULATION = (
    (CounterMetricFamily, "loraloom_spec_decode_num_drafts", "Drafts verified (a request's proposed tokens in one step).",
     "spec_decode_drafts_total"),
    (CounterMetricFamily, "loraloom_spec_decode_num_draft_tokens", "Proposed tokens verified.",
     "spec_decode_draft_tokens_total"),
    (CounterMetricFamily, "loraloom_spec_decode_num_accepted_tokens", "Proposed tokens the model agreed with.",
     "spec_decode_accepted_tokens_total"),
    (CounterMetricFamily, "loraloom_spec_decode_num_emitted_tokens",
     "Tokens emitted by steps that verified a draft (the accepted ones and one more each).",
     "spec_decode_emitted_tokens_total"),
)
_LATENCIES = (
    ("loraloom_time_to_first_token_seconds", "From a request's arrival at the engine to its first token.",
     "time_to_first_token"),
    ("loraloom_inter_token_latency_seconds", "Between a request's consecutive tokens.", "inter_token_latency"),
    ("loraloom_e2e_request_latency_seconds",
     "From a request's arrival at the engine to its end (stopped, length or failed; aborts not counted).",
     "e2e_request_latency"),
)


def _per_replica(readings: list[tuple[list[str], EngineStats]], replica_label: list[str]) -> Iterator[Metric]:
    """Every family but the router protocol's, with one series per reading (`replica_label` [] or ["replica"])."""
    for family_type, name, help_text, field in _ENGINE_TOTALS:
        family = family_type(name, help_text, labels=replica_label)
        for replica, stats in readings:
            family.add_metric(replica, getattr(stats, field))
        yield family
    for name, help_text, field in _LATENCIES:
        histogram = HistogramMetricFamily(name, help_text, labels=[*replica_label, *LATENCY_LABELS])
        for replica, stats in readings:
            for labels, snapshot in sorted(getattr(stats, field).items()):
                histogram.add_metric([*replica, *labels], [(floatToGoString(bound), count) for bound, count
                                                           in snapshot.buckets], snapshot.sum)
        yield histogram
    finished = CounterMetricFamily(REQUESTS_FINISHED, "Requests that ended, by how: stop, length, abort or error.",
                                   labels=[*replica_label, *LATENCY_LABELS, "finished_reason"])
    for replica, stats in readings:
        for labels, count in sorted(stats.finished_requests_total.items()):
            finished.add_metric([*replica, *labels], count)
    yield finished
    for label_names, table in ((["tenant"], _PER_TENANT), (ADAPTER_LABELS, _PER_ADAPTER), (LATENCY_LABELS, _SPECULATION)):
        for family_type, name, help_text, field in table:
            family = family_type(name, help_text, labels=[*replica_label, *label_names])
            for replica, stats in readings:
                for key, value in sorted(getattr(stats, field).items()):  # a tenant's name, or (tenant, adapter)
                    family.add_metric([*replica, *(key if isinstance(key, tuple) else (key,))], value)
            yield family


def _lora_info(stats: EngineStats) -> GaugeMetricFamily:
    family = GaugeMetricFamily(LORA_INFO, "Adapters of the running and waiting requests; value: when read (Unix time).",
                               labels=LORA_INFO_LABELS)
    family.add_metric([str(stats.adapter_slots_total), ",".join(stats.running_lora_adapters),
                       ",".join(stats.waiting_lora_adapters)], time.time())
    return family


def engine_metrics_registry(read_stats: Callable[[], EngineStats],
                            read_replicas: ReadReplicas | None = None) -> CollectorRegistry:
    """A registry of its own (not the process-global default), so several apps in one process don't collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineStatsCollector(read_stats, read_replicas))
    return registry
