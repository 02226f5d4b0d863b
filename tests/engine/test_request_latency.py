"""engine/request_latency.py and what the engine feeds it: Prometheus-shaped histograms (cumulative
buckets ending at +Inf, a value on a bound counted in that bound's bucket), one time-to-first-token
and one end-to-end observation per request that ends, one inter-token gap per later token; and the
stats the router metrics read (LoRA adapter lists, KV usage, residency counters)."""
from __future__ import annotations

import math

import pytest
from lora_factory import make_peft_adapter

from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.request import SamplingParams
from loraloom.engine.request_latency import (E2E_REQUEST_LATENCY_BUCKETS, LatencyHistogram,
                                             TIME_TO_FIRST_TOKEN_BUCKETS, total_histogram)
from loraloom.engine.tenancy import TenantTag


def test_a_histogram_counts_cumulatively_with_values_on_a_bound_in_that_bound_s_bucket():
    histogram = LatencyHistogram((0.1, 1.0))
    histogram.observe(0.1)
    histogram.observe_all([0.05, 0.5, 3.0])
    snapshot = histogram.snapshot()
    assert snapshot.buckets == ((0.1, 2), (1.0, 3), (math.inf, 4))
    assert snapshot.count == 4 and snapshot.sum == pytest.approx(3.65)


def test_bounds_must_increase():
    with pytest.raises(ValueError, match="bounds"):
        LatencyHistogram((1.0, 0.5))


def test_the_buckets_are_vllm_s():
    # A dashboard's le="0.1" or le="2.5" series must exist for ours as for vLLM's.
    assert {0.1, 0.5, 1.0, 2.5}.issubset(TIME_TO_FIRST_TOKEN_BUCKETS)
    assert E2E_REQUEST_LATENCY_BUCKETS[0] == 0.3 and E2E_REQUEST_LATENCY_BUCKETS[-1] == 7680.0


@pytest.fixture(scope="module")
def adapters(tiny_checkpoint, tmp_path_factory) -> list[AdapterHandle]:
    root = tmp_path_factory.mktemp("latency_adapters")
    return [AdapterHandle(key=f"tenant-{i}/digest", name=f"ad{i}@1",
                          uri=make_peft_adapter(tiny_checkpoint, root / f"ad{i}", rank=4, alpha=8,
                                                target_modules=["q_proj"], seed=700 + i).as_uri())
            for i in range(3)]


def test_each_finished_request_is_observed_once_and_each_later_token_gives_one_gap(tiny_checkpoint, adapters):
    # One sequence at a time and one slot: the other requests wait, listed by adapter, oldest first.
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=32, block_size=4, max_num_seqs=1, max_loras=1))
    budgets = {"r0": 4, "r1": 1, "r2": 6, "r3": 3}
    chosen = {"r0": adapters[0], "r1": None, "r2": adapters[1], "r3": adapters[2]}
    for request_id, budget in budgets.items():
        engine.add_request(request_id, [11, 12, 13, 14, 15], SamplingParams(max_tokens=budget, temperature=0.0,
                                                                            ignore_eos=True), chosen[request_id])
    engine.step()
    stats = engine.stats()
    assert stats.running_lora_adapters == ["ad0@1"]
    assert stats.waiting_lora_adapters == ["ad1@1", "ad2@1"]  # r1 asks for the base model: not listed
    assert 0 < stats.kv_cache_usage <= 1
    while engine.has_unfinished():
        engine.step()

    stats = engine.stats()
    ttft, e2e = total_histogram(stats.time_to_first_token), total_histogram(stats.e2e_request_latency)
    assert ttft.count == len(budgets)
    assert e2e.count == len(budgets)
    assert total_histogram(stats.inter_token_latency).count == sum(budget - 1 for budget in budgets.values())
    # Each request's end comes after its first token.
    assert e2e.sum >= ttft.sum > 0
    # Each request under its own model label (no tenant tag: the tenant label is empty).
    assert {labels: h.count for labels, h in stats.time_to_first_token.items()} == {
        ("", "base"): 1, ("", "ad0@1"): 1, ("", "ad1@1"): 1, ("", "ad2@1"): 1}
    assert stats.inter_token_latency[("", "ad1@1")].count == budgets["r2"] - 1
    assert stats.finished_requests_total == {("", "base", "length"): 1, ("", "ad0@1", "length"): 1,
                                             ("", "ad1@1", "length"): 1, ("", "ad2@1", "length"): 1}
    assert (stats.running_lora_adapters, stats.waiting_lora_adapters, stats.kv_cache_usage) == ([], [], 0.0)
    # Three adapters through one slot: three loads, two of them over another adapter; each fetched once.
    assert (stats.adapter_slot_loads_total, stats.adapter_slot_evictions_total) == (3, 2)
    assert (stats.host_cache_adapters, stats.host_cache_misses_total) == (3, 3)
    assert stats.host_cache_bytes > 0


def test_an_aborted_request_is_not_an_end_to_end_observation(tiny_checkpoint):
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=32, block_size=4))
    engine.add_request("gone", [11, 12, 13], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.abort_request("gone")
    stats = engine.stats()
    assert (stats.time_to_first_token[("", "base")].count, stats.e2e_request_latency[("", "base")].count) == (1, 0)
    assert stats.finished_requests_total == {("", "base", "abort"): 1}


def test_adapters_past_the_cap_count_under_their_tenant_as_other(tiny_checkpoint, adapters):
    # A cap of two (tenant, adapter) pairs: acme's ad0 and ad1 keep their names, acme's ad2 and globex's
    # ad0 (a pair of its own) fold into "other" under their tenants; the base model never folds.
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=64, block_size=4, metrics_max_adapters=2))
    acme, globex = TenantTag(id="a", name="acme"), TenantTag(id="g", name="globex")
    sent = [("r0", adapters[0], acme), ("r1", adapters[1], acme), ("r2", adapters[2], acme),
            ("r3", adapters[0], globex), ("r4", None, globex), ("r5", adapters[0], acme)]
    for request_id, adapter, tenant in sent:
        engine.add_request(request_id, [11, 12, 13], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
                           adapter, tenant)
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats()
    expected = {("acme", "ad0@1"): 2, ("acme", "ad1@1"): 1, ("acme", "other"): 1, ("globex", "other"): 1,
                ("globex", "base"): 1}
    assert {labels: h.count for labels, h in stats.e2e_request_latency.items()} == expected
    assert stats.requests_per_adapter_total == expected
    assert stats.finished_requests_total == {(*labels, "length"): count for labels, count in expected.items()}


def test_the_cap_must_not_be_negative():
    with pytest.raises(ValueError, match="metrics_max_adapters"):
        EngineConfig(metrics_max_adapters=-1)
