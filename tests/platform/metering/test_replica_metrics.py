"""Under Ray Serve the gateway reads each engine replica's stats (RayEngineClient.stats_by_replica):
the router-protocol gauges a Kubernetes router reads stay one series, the replicas summed, while the
other families carry a `replica` label, one series per replica. An engine in the process has no
replica label at all. Scraped as Prometheus text from the registry the app builds."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import EngineStats, HistogramSnapshot
from loraloom.platform.metering.engine_metrics import engine_metrics_registry

BOUNDS = (0.1, 1.0, float("inf"))


def replica_stats(running: int, ttft_count: int, finished: int) -> EngineStats:
    return EngineStats(
        num_running=running, num_waiting=1, kv_blocks_used=2, kv_blocks_total=10, kv_blocks_cached=0,
        adapter_slots_used=1, adapter_slots_total=4, prompt_tokens_total=10 * running, generation_tokens_total=5,
        preemptions_total=0, running_per_adapter={("acme", "bot@1"): running}, waiting_per_adapter={},
        requests_per_adapter_total={("acme", "bot@1"): finished}, block_size=16, running_lora_adapters=["bot@1"],
        finished_requests_total={("acme", "bot@1", "stop"): finished},
        time_to_first_token={("acme", "bot@1"): HistogramSnapshot(buckets=tuple(zip(BOUNDS, (ttft_count,) * 3)),
                                                                  sum=0.05 * ttft_count, count=ttft_count)},
    )


def samples(registry) -> list:
    text = generate_latest(registry).decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def test_replicas_get_a_label_and_the_router_gauges_stay_summed():
    replicas = {"engine#a": replica_stats(2, 3, 4), "engine#b": replica_stats(5, 1, 6)}
    read = list(samples(engine_metrics_registry(lambda: None, lambda: replicas)))

    def by_replica(name: str, **matching: str) -> dict[str, float]:
        return {s.labels["replica"]: s.value for s in read
                if s.name == name and all(s.labels.get(k) == v for k, v in matching.items())}

    (running,) = [s for s in read if s.name == "loraloom_requests_running"]
    (usage,) = [s for s in read if s.name == "loraloom_kv_cache_usage_ratio"]
    assert (running.labels, running.value) == ({}, 7) and usage.value == 4 / 20
    assert by_replica("loraloom_prompt_tokens_total") == {"engine#a": 20, "engine#b": 50}
    assert by_replica("loraloom_time_to_first_token_seconds_count", tenant="acme", model="bot@1") == {
        "engine#a": 3, "engine#b": 1}
    assert by_replica("loraloom_requests_finished_total", finished_reason="stop") == {"engine#a": 4, "engine#b": 6}
    assert by_replica("loraloom_adapter_requests_running", adapter="bot@1") == {"engine#a": 2, "engine#b": 5}


def test_an_engine_in_the_process_has_no_replica_label():
    read = samples(engine_metrics_registry(lambda: replica_stats(2, 3, 4)))
    assert not [s for s in read if "replica" in s.labels]
    assert {s.value for s in read if s.name == "loraloom_requests_finished_total"} == {4}
