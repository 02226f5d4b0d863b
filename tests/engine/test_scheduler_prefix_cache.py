"""The scheduler's use of the prefix cache on the simulated model (scheduler_simulation.py): reuse is
per adapter, and requests behind a prefix another request is computing wait for it once."""
from __future__ import annotations

import random

from scheduler_simulation import (VOCAB, Simulation, Spec, assert_finishes_as_unconstrained, play, random_specs,
                                  unconstrained_outputs)

from loraloom.engine.config import EngineConfig


# ----------------------------------------------------------------------------- prefix cache
def test_prefix_cache_reuse_through_the_scheduler_is_per_adapter():
    config = EngineConfig(block_size=8, num_kv_blocks=64, max_num_batched_tokens=64, max_loras=2)
    simulation = Simulation(config)
    prompt = [(3 * i) % (VOCAB - 1) + 1 for i in range(40)]
    simulation.add("first", prompt, max_tokens=3)
    simulation.run_to_completion(max_steps=20)

    variant = prompt[:36] + [5, 6, 7]
    same_adapter = simulation.add("same", variant, max_tokens=3)
    other_adapter = simulation.add("other", variant, max_tokens=3, adapter="x")
    output = simulation.step()
    first_chunk = {item.request.request_id: item.num_new_tokens for item in output.scheduled}
    assert same_adapter.num_cached_tokens == 32  # 4 full blocks of the common 36 tokens
    assert first_chunk["same"] == len(variant) - 32
    assert other_adapter.num_cached_tokens == 0 and first_chunk["other"] == len(variant)
    assert_finishes_as_unconstrained(simulation, config, max_tokens=3)


# ------------------------------------------------------------- prefixes computed by another request
def test_requests_arriving_together_behind_one_long_prefix_compute_it_once():
    config = EngineConfig(block_size=8, num_kv_blocks=64, max_num_batched_tokens=256, max_loras=2)
    simulation = Simulation(config)
    system = [(5 * i) % (VOCAB - 1) + 1 for i in range(48)]  # 6 blocks
    short_system = system[:16]  # 2 blocks: below the threshold, so not worth a step's wait
    leader = simulation.add("leader", system + [1, 2, 3], max_tokens=4)
    follower = simulation.add("follower", system + [4, 5], max_tokens=4)
    other_adapter = simulation.add("other-adapter", system + [6], max_tokens=4, adapter="x")
    short = simulation.add("short-prefix", short_system + [7, 8], max_tokens=4)

    first = {item.request.request_id for item in simulation.step().scheduled}
    assert first == {"leader", "other-adapter", "short-prefix"}, "the follower waits for the leader's prefix"
    assert short.num_cached_tokens == 0 and other_adapter.num_cached_tokens == 0
    second = {item.request.request_id: item.num_new_tokens for item in simulation.step().scheduled}
    assert follower.num_cached_tokens == 48 and second["follower"] == 2, "it reused all six blocks"
    assert leader.num_cached_tokens == 0
    assert_finishes_as_unconstrained(simulation, config, max_tokens=4)


def test_a_waiting_request_goes_on_when_the_request_computing_its_prefix_is_aborted():
    # The leader's 64-token prompt is prefilled 16 tokens a step; the follower shares all of it.
    config = EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_loras=1)
    simulation = Simulation(config)
    prompt = [(7 * i) % (VOCAB - 1) + 1 for i in range(64)]
    simulation.add("leader", prompt + [1], max_tokens=3)
    follower = simulation.add("follower", prompt + [2], max_tokens=3)
    for _ in range(2):
        assert [item.request.request_id for item in simulation.step().scheduled] == ["leader"]
    simulation.scheduler.abort_request("leader")  # mid-prefill: 32 of its tokens computed
    assert [item.request.request_id for item in simulation.step().scheduled] == ["follower"]
    assert follower.num_cached_tokens == 32, "what the leader committed before its abort is reused"
    simulation.run_to_completion(max_steps=40)
    assert simulation.outputs()["follower"] == unconstrained_outputs(
        config, [Spec("follower", 0, tuple(prompt + [2]), 3, None)])["follower"]


def test_random_workloads_with_long_shared_prefixes_match_an_unconstrained_run():
    """Followers waiting on in-flight prefixes, with preemptions and aborts among them."""
    rng = random.Random(3)
    config = EngineConfig(block_size=4, num_kv_blocks=40, max_num_seqs=8, max_num_batched_tokens=24, max_loras=2)
    specs = random_specs(rng, count=50, max_len=config.num_kv_blocks * config.block_size,
                         adapters=[None, "a", "b"], last_arrival=120, abort_fraction=0.3, prefix_lengths=(36, 50))
    simulation = play(config, specs, max_steps=5000)
    requests = simulation.requests.values()
    assert simulation.preemption_steps > 0, "workload too easy"
    deferred = [rid for rid, step in simulation.admitted_at.items()
                if simulation.cached_at_first_schedule[rid] >= 32 and step > simulation.added_at[rid]]
    assert deferred, "no request reused a prefix computed after it arrived"
    assert any(r.num_cached_tokens > 0 for r in requests)
    reference = unconstrained_outputs(config, specs)
    for request_id, tokens in simulation.outputs().items():
        assert tokens == reference[request_id], request_id
