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
the same name move different series. Cardinality: the running and waiting gauges list only pairs
with requests in flight; the requests counter keeps at most MAX_ADAPTER_SERIES pairs and counts
any further ones under tenant="other", adapter="other" (engine/outputs.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loraloom.engine import EngineStats

ADAPTER_LABELS = ["tenant", "adapter"]  # the order of EngineStats' per-adapter keys

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


class EngineStatsCollector(Collector):
    def __init__(self, read_stats: Callable[[], EngineStats]) -> None:
        self.read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        stats = self.read_stats()
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
        yield CounterMetricFamily(
            "loraloom_preemptions", "Requests preempted (their KV freed, recomputed later).", value=stats.preemptions_total
        )
        yield from _latency_histograms(stats)
        yield from _residency(stats)
        yield GaugeMetricFamily(
            "loraloom_kv_blocks_used", "KV cache blocks referenced by requests.", value=stats.kv_blocks_used
        )
        yield GaugeMetricFamily(
            "loraloom_kv_blocks_cached", "Unreferenced KV blocks kept for prefix reuse.", value=stats.kv_blocks_cached
        )
        yield GaugeMetricFamily("loraloom_kv_blocks_total", "KV cache blocks in the pool.", value=stats.kv_blocks_total)
        yield GaugeMetricFamily(
            "loraloom_adapter_slots_used", "GPU adapter slots holding an adapter.", value=stats.adapter_slots_used
        )
        yield GaugeMetricFamily(
            "loraloom_adapter_slots_total", "GPU adapter slots (max_loras).", value=stats.adapter_slots_total
        )
        yield CounterMetricFamily(
            "loraloom_prompt_tokens", "Prompt tokens of admitted requests.", value=stats.prompt_tokens_total
        )
        yield CounterMetricFamily(
            "loraloom_generation_tokens", "Tokens generated.", value=stats.generation_tokens_total
        )
        yield from _per_tenant(stats)
        yield _per_adapter(
            GaugeMetricFamily(
                "loraloom_adapter_requests_running", "Requests being generated, per adapter.", labels=ADAPTER_LABELS
            ),
            stats.running_per_adapter,
        )
        yield _per_adapter(
            GaugeMetricFamily("loraloom_adapter_requests_waiting", "Requests queued, per adapter.", labels=ADAPTER_LABELS),
            stats.waiting_per_adapter,
        )
        yield _per_adapter(
            CounterMetricFamily("loraloom_adapter_requests", "Requests received, per adapter.", labels=ADAPTER_LABELS),
            stats.requests_per_adapter_total,
        )


def _lora_info(stats: EngineStats) -> GaugeMetricFamily:
    family = GaugeMetricFamily(LORA_INFO, "Adapters of the running and waiting requests; value: when read (Unix time).",
                               labels=LORA_INFO_LABELS)
    family.add_metric([str(stats.adapter_slots_total), ",".join(stats.running_lora_adapters),
                       ",".join(stats.waiting_lora_adapters)], time.time())
    return family


def _latency_histograms(stats: EngineStats) -> Iterator[Metric]:
    for name, help_text, snapshot in (
        ("loraloom_time_to_first_token_seconds", "From a request's arrival at the engine to its first token.",
         stats.time_to_first_token),
        ("loraloom_inter_token_latency_seconds", "Between a request's consecutive tokens.", stats.inter_token_latency),
        ("loraloom_e2e_request_latency_seconds",
         "From a request's arrival at the engine to its end (stopped, length or failed; aborts not counted).",
         stats.e2e_request_latency),
    ):
        if snapshot is not None:
            yield HistogramMetricFamily(
                name, help_text, buckets=[(floatToGoString(bound), count) for bound, count in snapshot.buckets],
                sum_value=snapshot.sum,
            )


def _residency(stats: EngineStats) -> Iterator[Metric]:
    """Where adapters are: GPU slots (used and total above) and the host cache, and the traffic between."""
    for family, name, help_text, value in (
        (GaugeMetricFamily, "loraloom_host_cache_adapters", "Adapters whose weights the host cache holds.",
         stats.host_cache_adapters),
        (GaugeMetricFamily, "loraloom_host_cache_bytes", "Host memory the cached adapter weights take.",
         stats.host_cache_bytes),
        (GaugeMetricFamily, "loraloom_host_cache_capacity", "Adapters the host cache keeps (not counting held ones).",
         stats.host_cache_capacity),
        (CounterMetricFamily, "loraloom_host_cache_hits", "Adapter lookups answered from host memory.",
         stats.host_cache_hits_total),
        (CounterMetricFamily, "loraloom_host_cache_misses", "Adapter lookups that fetched from storage.",
         stats.host_cache_misses_total),
        (CounterMetricFamily, "loraloom_host_cache_evictions", "Adapters dropped from host memory for room.",
         stats.host_cache_evictions_total),
        (CounterMetricFamily, "loraloom_adapter_slot_loads", "Adapters copied into a GPU slot.",
         stats.adapter_slot_loads_total),
        (CounterMetricFamily, "loraloom_adapter_slot_evictions", "GPU slot loads that replaced another adapter.",
         stats.adapter_slot_evictions_total),
    ):
        yield family(name, help_text, value=value)


def _per_tenant(stats: EngineStats) -> Iterator[Metric]:
    for family, name, help_text, values in (
        (GaugeMetricFamily, "loraloom_tenant_requests_waiting", "Requests queued for admission, per tenant.",
         stats.queued_per_tenant),
        (GaugeMetricFamily, "loraloom_tenant_requests_running", "Requests being generated, per tenant.",
         stats.running_per_tenant),
        (CounterMetricFamily, "loraloom_tenant_served_tokens", "Tokens served (prompt + output), per tenant.",
         stats.served_tokens_per_tenant),
        (GaugeMetricFamily, "loraloom_tenant_share_counter",
         "Fair-share virtual token counter (served tokens / weight, plus lifts), per tenant.",
         stats.share_counter_per_tenant),
    ):
        metric = family(name, help_text, labels=["tenant"])
        for tenant, value in sorted(values.items()):
            metric.add_metric([tenant], value)
        yield metric


def _per_adapter(family: GaugeMetricFamily | CounterMetricFamily, counts: dict[tuple[str, str], int]) -> Metric:
    for labels, count in sorted(counts.items()):
        family.add_metric(list(labels), count)
    return family


def engine_metrics_registry(read_stats: Callable[[], EngineStats]) -> CollectorRegistry:
    """A registry of its own (not the process-global default), so several apps in one process don't collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineStatsCollector(read_stats))
    return registry
