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
                                             TIME_TO_FIRST_TOKEN_BUCKETS)


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
    assert stats.time_to_first_token.count == len(budgets)
    assert stats.e2e_request_latency.count == len(budgets)
    assert stats.inter_token_latency.count == sum(budget - 1 for budget in budgets.values())
    # Each request's end comes after its first token.
    assert stats.e2e_request_latency.sum >= stats.time_to_first_token.sum > 0
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
    assert (stats.time_to_first_token.count, stats.e2e_request_latency.count) == (1, 0)
