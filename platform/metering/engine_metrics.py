"""Prometheus metrics read from the engine at scrape time (no counters kept on the side).

Per-adapter metrics carry two labels: `tenant` (the name of the tenant whose requests they count,
as the API shows it) and `adapter` (the name the request resolved to: `name@N` for a registry
version, a checkpoint id, a server-local adapter's name, or `base`), so two tenants' adapters of
the same name move different series. Cardinality: the running and waiting gauges list only pairs
with requests in flight; the requests counter keeps at most MAX_ADAPTER_SERIES pairs and counts
any further ones under tenant="other", adapter="other" (engine/outputs.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraloom.engine import EngineStats

ADAPTER_LABELS = ["tenant", "adapter"]  # the order of EngineStats' per-adapter keys


class EngineStatsCollector(Collector):
    def __init__(self, read_stats: Callable[[], EngineStats]) -> None:
        self.read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        stats = self.read_stats()
        yield GaugeMetricFamily("loraloom_requests_running", "Requests being generated now.", value=stats.num_running)
        yield GaugeMetricFamily("loraloom_requests_waiting", "Requests queued for admission.", value=stats.num_waiting)
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


def _per_adapter(family: GaugeMetricFamily | CounterMetricFamily, counts: dict[tuple[str, str], int]) -> Metric:
    for labels, count in sorted(counts.items()):
        family.add_metric(list(labels), count)
    return family


def engine_metrics_registry(read_stats: Callable[[], EngineStats]) -> CollectorRegistry:
    """A registry of its own (not the process-global default), so several apps in one process don't collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineStatsCollector(read_stats))
    return registry
