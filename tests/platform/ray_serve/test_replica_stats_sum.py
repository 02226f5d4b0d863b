"""The gateway over Ray Serve reports its replicas' stats as one engine's (metering/replica_stats.sum_stats):
counts added, per-adapter counts added per pair, adapter lists joined once each, latency histograms
added bucket by bucket, and the block size (a setting every replica shares) kept, not added."""
from __future__ import annotations

import pytest

from loraloom.engine import EngineStats, HistogramSnapshot
from loraloom.platform.metering.replica_stats import sum_stats

BOUNDS = (0.1, 1.0, float("inf"))


def histogram(counts: tuple[int, int, int], total: float) -> HistogramSnapshot:
    return HistogramSnapshot(buckets=tuple(zip(BOUNDS, counts)), sum=total, count=counts[-1])


def replica(running: int, adapters: list[str], per_adapter: dict, ttft: dict) -> EngineStats:
    return EngineStats(
        num_running=running, num_waiting=1, kv_blocks_used=3, kv_blocks_total=10, kv_blocks_cached=2,
        adapter_slots_used=1, adapter_slots_total=4, prompt_tokens_total=100, generation_tokens_total=50,
        preemptions_total=1, running_per_adapter=per_adapter, waiting_per_adapter={},
        requests_per_adapter_total=per_adapter, block_size=16, running_lora_adapters=adapters,
        time_to_first_token=ttft,
    )


def test_two_replicas_read_as_one_engine():
    a = replica(2, ["bot@1", "x@2"], {("acme", "bot@1"): 2}, {("acme", "bot@1"): histogram((1, 2, 2), 0.6)})
    b = replica(3, ["x@2", "y@1"], {("acme", "bot@1"): 1, ("other", "y@1"): 2},
                {("acme", "bot@1"): histogram((0, 1, 3), 4.0), ("acme", "base"): histogram((1, 1, 1), 0.05)})
    merged = sum_stats([a, b])

    assert (merged.num_running, merged.kv_blocks_total, merged.preemptions_total) == (5, 20, 2)
    assert merged.kv_cache_usage == pytest.approx(6 / 20)
    assert merged.block_size == 16
    assert merged.running_per_adapter == {("acme", "bot@1"): 3, ("other", "y@1"): 2}
    assert merged.running_lora_adapters == ["bot@1", "x@2", "y@1"]
    # Histograms added per label pair, bucket by bucket; a pair only one replica has is kept as it is.
    assert merged.time_to_first_token == {
        ("acme", "bot@1"): HistogramSnapshot(buckets=tuple(zip(BOUNDS, (1, 3, 5))), sum=4.6, count=5),
        ("acme", "base"): histogram((1, 1, 1), 0.05),
    }
    assert merged.e2e_request_latency == {}  # no replica observed one


def test_finished_requests_are_added_per_reason():
    a, b = replica(1, [], {}, {}), replica(1, [], {}, {})
    a.finished_requests_total = {("acme", "bot@1", "stop"): 2}
    b.finished_requests_total = {("acme", "bot@1", "stop"): 1, ("acme", "base", "abort"): 4}
    assert sum_stats([a, b]).finished_requests_total == {("acme", "bot@1", "stop"): 3, ("acme", "base", "abort"): 4}


def test_per_tenant_loads_are_added_per_tenant():
    a, b = replica(1, [], {}, {}), replica(1, [], {}, {})
    a.queued_per_tenant, b.queued_per_tenant = {"acme": 2}, {"acme": 1, "globex": 4}
    a.running_per_tenant, b.running_per_tenant = {"acme": 1}, {"globex": 3}
    a.served_tokens_per_tenant, b.served_tokens_per_tenant = {"acme": 100}, {"acme": 20, "globex": 7}
    a.share_counter_per_tenant, b.share_counter_per_tenant = {"acme": 50.0}, {"acme": 10.0, "globex": 3.5}
    merged = sum_stats([a, b])
    assert merged.queued_per_tenant == {"acme": 3, "globex": 4}
    assert merged.running_per_tenant == {"acme": 1, "globex": 3}
    assert merged.served_tokens_per_tenant == {"acme": 120, "globex": 7}
    assert merged.share_counter_per_tenant == {"acme": 60.0, "globex": 3.5}
