"""The scheduler on the simulated model (scheduler_simulation.py): randomized workloads, chunked
prefill, preemption and aborts. Prefix caching and adapter slots have files of their own."""
from __future__ import annotations

import random

import pytest
from scheduler_simulation import (VOCAB, Simulation, Spec, adapter_handle, play, random_specs,
                                  unconstrained_outputs)

from loraloom.engine.config import EngineConfig
from loraloom.engine.request import Request, RequestStatus, SamplingParams


# ---------------------------------------------------------------------- randomized workloads
# The assertions on preemptions, aborts and cache hits keep these seeded workloads honest: each must
# exercise all of them.
@pytest.mark.parametrize("seed, enable_prefix_caching", [(0, True), (1, True), (0, False)])
def test_random_workloads_keep_invariants_and_match_an_unconstrained_run(seed: int, enable_prefix_caching: bool):
    rng = random.Random(seed)
    config = EngineConfig(block_size=4, num_kv_blocks=20, max_num_seqs=8, max_num_batched_tokens=24, max_loras=2,
                          enable_prefix_caching=enable_prefix_caching)
    specs = random_specs(rng, count=50, max_len=config.num_kv_blocks * config.block_size,
                         adapters=[None, None, "a", "b", "c", "d"], last_arrival=200, abort_fraction=0.3)
    simulation = play(config, specs, max_steps=5000)
    assert simulation.step_index > 200
    requests = simulation.requests.values()
    assert simulation.preemption_steps > 0 and any(r.num_preemptions for r in requests), "workload too easy"
    aborted_in = set(simulation.aborted_while.values())
    assert aborted_in == {RequestStatus.WAITING, RequestStatus.RUNNING}, f"aborts only hit {aborted_in}"
    if enable_prefix_caching:
        assert any(r.num_cached_tokens > 0 for r in requests)
    reference = unconstrained_outputs(config, specs)
    for request_id, tokens in simulation.outputs().items():
        assert tokens == reference[request_id], request_id


@pytest.mark.parametrize("seed", [0, 1])
def test_drafts_verified_in_random_workloads_give_the_same_outputs(seed: int):
    """Speculative decoding's scheduling: drafts take only what a step leaves (budget, blocks), never
    preempt, and rejected proposals' KV is written over: outputs are those of an unconstrained run."""
    rng = random.Random(seed)
    config = EngineConfig(block_size=4, num_kv_blocks=24, max_num_seqs=6, max_num_batched_tokens=20, max_loras=2)
    specs = random_specs(rng, count=40, max_len=config.num_kv_blocks * config.block_size,
                         adapters=[None, "a", "b"], last_arrival=150, abort_fraction=0.2)
    simulation = play(config, specs, max_steps=5000, draft_rng=random.Random(seed + 100))
    assert simulation.preemption_steps > 0, "workload too easy"
    assert 0 < simulation.accepted_tokens < simulation.drafted_tokens, "drafts never verified, or never rejected"
    reference = unconstrained_outputs(config, specs)
    for request_id, tokens in simulation.outputs().items():
        assert tokens == reference[request_id], request_id


# --------------------------------------------------------------------------- chunked prefill
def test_long_prefill_is_chunked_and_decodes_run_in_the_same_steps():
    config = EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_loras=1)
    simulation = Simulation(config)
    long_prompt = [(7 * i) % (VOCAB - 1) + 1 for i in range(100)]
    # `long` is created first, so it is older, but only arrives once `short` is decoding: the
    # oldest running request is then a long prefill, the case that would stall decodes.
    long = Request("long", long_prompt, SamplingParams(max_tokens=2))
    short = simulation.add("short", [1, 2, 3], max_tokens=40)
    simulation.step()
    assert short.num_computed_tokens == 3 and len(short.output_token_ids) == 1
    simulation.requests["long"] = long
    simulation.scheduler.add_request(long)

    chunks = []
    while long.num_computed_tokens < len(long_prompt):
        output = simulation.step()
        by_id = {item.request.request_id: item for item in output.scheduled}
        chunks.append(by_id["long"].num_new_tokens)
        assert by_id["short"].num_new_tokens == 1 and by_id["short"].sample, "the decode was stalled"
        assert by_id["long"].sample == (long.num_computed_tokens == len(long_prompt))
    # Each chunk is the budget less the one token kept for the decode.
    chunk = config.max_num_batched_tokens - 1
    assert chunks == [chunk] * (len(long_prompt) // chunk) + [len(long_prompt) % chunk]
    simulation.run_to_completion(max_steps=200)
    expected = unconstrained_outputs(config, [Spec("long", 0, tuple(long_prompt), 2, None),
                                              Spec("short", 0, (1, 2, 3), 40, None)])
    assert simulation.outputs() == expected


# ------------------------------------------------------------------------------- preemption
def test_preemption_by_recompute_finishes_everything_with_unchanged_tokens():
    config = EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=8, max_num_batched_tokens=32, max_loras=2)
    rng = random.Random(5)
    specs = [Spec(f"p{i}", i // 3, tuple(rng.randrange(1, VOCAB) for _ in range(6 + i % 5)), 24 + i % 7,
                  [None, "a", "b"][i % 3]) for i in range(9)]
    simulation = play(config, specs, max_steps=2000)
    assert simulation.preemption_steps > 0
    assert sum(r.num_preemptions for r in simulation.requests.values()) >= 2
    assert simulation.outputs() == unconstrained_outputs(config, specs)


def test_a_step_that_preempts_admits_nobody_even_when_the_victim_freed_a_slot():
    config = EngineConfig(block_size=4, num_kv_blocks=4, max_num_seqs=8, max_num_batched_tokens=64, max_loras=1)
    simulation = Simulation(config)
    # Created oldest first; "w" arrives last, so it is older than "y" yet waits behind y's slot.
    old = Request("old", [1, 2, 3, 4], SamplingParams(max_tokens=8))
    w = Request("w", [5, 6], SamplingParams(max_tokens=2), adapter_handle("b"))
    y = Request("y", list(range(1, 13)), SamplingParams(max_tokens=2), adapter_handle("a"))
    for request in (old, y):
        simulation.requests[request.request_id] = request
        simulation.scheduler.add_request(request)
    simulation.step()  # old: 1 block, y: 3 blocks, none left
    simulation.requests["w"] = w
    simulation.scheduler.add_request(w)
    output = simulation.step()  # old's next token needs a block: y goes, and frees slot and blocks w could use
    assert output.preempted_ids == ["y"] and output.adapter_loads == []
    assert w.status is RequestStatus.WAITING
    simulation.step()
    assert w.status is not RequestStatus.WAITING  # admitted at the next step
    simulation.run_to_completion(max_steps=100)


def test_a_request_that_does_not_fit_is_not_overtaken_by_younger_ones():
    config = EngineConfig(block_size=4, num_kv_blocks=6, max_num_seqs=8, max_num_batched_tokens=64, max_loras=1)
    simulation = Simulation(config)
    holder = simulation.add("holder", list(range(1, 13)), max_tokens=6)  # 3 blocks, then a 4th and 5th
    simulation.step()
    big = simulation.add("big", list(range(20, 36)), max_tokens=2)  # 4 blocks: more than are free
    small = simulation.add("small", [40, 41], max_tokens=2)  # would fit
    simulation.step()
    assert big.status is small.status is RequestStatus.WAITING
    simulation.run_to_completion(max_steps=100)
    assert simulation.admitted_at["big"] <= simulation.admitted_at["small"]
    assert holder.status is RequestStatus.FINISHED_LENGTH


# ------------------------------------------------------------------------------------ aborts
def test_abort_frees_waiting_and_running_requests():
    config = EngineConfig(block_size=4, num_kv_blocks=8, max_num_seqs=1, max_num_batched_tokens=8, max_loras=1)
    simulation = Simulation(config)
    running = simulation.add("running", [1, 2, 3, 4, 5], max_tokens=8, adapter="a")
    waiting = simulation.add("waiting", [1, 2, 3], max_tokens=8)
    output = simulation.step()
    assert [item.request for item in output.scheduled] == [running] and waiting.status is RequestStatus.WAITING
    assert simulation.scheduler.running_adapter_counts() == {("", "a"): 1}  # (tenant label, adapter name); none given here
    assert simulation.scheduler.waiting_adapter_counts() == {("", "base"): 1}
    assert simulation.scheduler.abort_request("waiting") is waiting
    assert simulation.scheduler.abort_request("running") is running
    assert simulation.scheduler.abort_request("running") is None
    assert running.status is waiting.status is RequestStatus.FINISHED_ABORTED
    simulation.assert_everything_released()
