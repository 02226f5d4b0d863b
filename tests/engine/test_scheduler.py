"""Scheduler against a simulated model.

The simulated model stands in for the runner and checks the scheduler's
output independently of its code: it writes each new token (with the
request's cache salt) into a simulated KV cache through the request's block
table, reads the whole context back through the table (all writes of a step
first, as the real runner does), and refuses to continue if what it reads
differs from the request's tokens. Adapter loads go into simulated slots and
every scheduled slot must hold the request's adapter. Sampled tokens are a
deterministic function of (request id, context), so a correct scheduler
produces, for every request, exactly the tokens of an unconstrained run.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import pytest

from loraloom.engine.lora.slots import AdapterSlotTable
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.kv_cache import BlockManager
from loraloom.engine.request import Request, RequestStatus, SamplingParams
from loraloom.engine.scheduler import Scheduler, SchedulerOutput
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag

VOCAB = 50
STOP_TOKEN = 0  # random workloads list it in stop_token_ids, so some requests end early, as on an EOS


def next_token(request_id: str, context: list[int]) -> int:
    digest = hashlib.blake2b(repr((request_id, context)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VOCAB


def adapter_handle(key: str) -> AdapterHandle:
    return AdapterHandle(key=f"{key}@v1", name=key, uri=f"file:///adapters/{key}")


class SimulatedModel:
    def __init__(self, config: EngineConfig) -> None:
        self.block_size = config.block_size
        self.kv: list[list[tuple[int, str] | None]] = [[None] * config.block_size for _ in range(config.num_kv_blocks)]
        self.slots: list[str | None] = [None] * config.max_loras

    def _cell(self, request: Request, position: int) -> tuple[int, int]:
        return request.block_ids[position // self.block_size], position % self.block_size

    def run(self, step: SchedulerOutput) -> dict[str, int]:
        for slot, adapter in step.adapter_loads:
            self.slots[slot] = adapter.key
        for item in step.scheduled:
            request = item.request
            if request.adapter is None:
                assert item.slot == -1
            else:
                assert self.slots[item.slot] == request.adapter_key, "scheduled into a slot holding another adapter"
            start = request.num_computed_tokens
            for position in range(start, start + item.num_new_tokens):
                block, offset = self._cell(request, position)
                self.kv[block][offset] = (request.all_token_ids[position], request.cache_scope)
        sampled = {}
        for item in step.scheduled:
            request = item.request
            end = request.num_computed_tokens + item.num_new_tokens
            assert item.sample == (end == request.num_tokens)
            seen = [self.kv[block][offset] for block, offset in (self._cell(request, p) for p in range(end))]
            expected = [(token, request.cache_scope) for token in request.all_token_ids[:end]]
            assert seen == expected, f"{request.request_id}: KV read through its block table differs from its tokens"
            if item.sample:
                sampled[request.request_id] = next_token(request.request_id, [token for token, _ in seen])
        return sampled


class Simulation:
    """Scheduler + block manager + slot table + simulated model, with the engine's stop checks."""

    def __init__(self, config: EngineConfig, slot_table: AdapterSlotTable | None = None) -> None:
        self.config = config
        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.slot_table = slot_table or AdapterSlotTable(config.max_loras)
        self.scheduler = Scheduler(config, self.block_manager, self.slot_table)
        self.model = SimulatedModel(config)
        self.step_index = 0
        self.requests: dict[str, Request] = {}
        self.added_at: dict[str, int] = {}
        self.admitted_at: dict[str, int] = {}
        self.cached_at_first_schedule: dict[str, int] = {}
        self.finished_at: dict[str, int] = {}
        self.preemption_steps = 0
        self.aborted_while: dict[str, RequestStatus] = {}  # aborted request -> its status when aborted

    def add(self, request_id: str, prompt: list[int], max_tokens: int, adapter: str | None = None,
            stop_token_ids: tuple[int, ...] = (), tenant: TenantTag = DEFAULT_TENANT) -> Request:
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids))
        request = Request(request_id, list(prompt), params, None if adapter is None else adapter_handle(adapter),
                          tenant=tenant)
        self.requests[request_id] = request
        self.added_at[request_id] = self.step_index
        self.scheduler.add_request(request)
        return request

    def step(self) -> SchedulerOutput:
        running_before = {r.request_id for r in self.requests.values() if r.status is RequestStatus.RUNNING}
        output = self.scheduler.schedule()
        self._check(output, running_before)
        sampled = self.model.run(output)
        self.scheduler.update_after_step(
            output, [sampled[item.request.request_id] for item in output.scheduled if item.sample])
        for item in output.scheduled:
            request = item.request
            self.admitted_at.setdefault(request.request_id, self.step_index)
            first_cached = self.cached_at_first_schedule.setdefault(request.request_id, request.num_cached_tokens)
            assert request.num_cached_tokens == first_cached, "num_cached_tokens changed after the first schedule"
            if item.sample:
                params = request.sampling_params
                stopped = request.output_token_ids[-1] in params.stop_token_ids
                if stopped or len(request.output_token_ids) >= params.max_tokens:
                    status = RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_LENGTH
                    self.scheduler.finish_request(request.request_id, status)
                    self.finished_at[request.request_id] = self.step_index
        self.block_manager.check_invariants()
        self.step_index += 1
        return output

    def run_to_completion(self, max_steps: int) -> None:
        while self.scheduler.has_unfinished():
            assert self.step_index < max_steps, f"unfinished after {max_steps} steps"
            self.step()
        self.assert_everything_released()

    def assert_everything_released(self) -> None:
        assert self.block_manager.num_free_blocks == self.config.num_kv_blocks
        assert self.block_manager.num_used_blocks == 0
        assert all(self.slot_table.ref_count(key) == 0 for key in self.slot_table.resident_keys())
        assert self.scheduler.num_running == self.scheduler.num_waiting == 0

    def outputs(self) -> dict[str, list[int]]:
        return {request_id: request.output_token_ids for request_id, request in self.requests.items()
                if request.status is not RequestStatus.FINISHED_ABORTED}

    def _check(self, output: SchedulerOutput, running_before: set[str]) -> None:
        config = self.config
        new_tokens = [item.num_new_tokens for item in output.scheduled]
        assert all(n >= 1 for n in new_tokens)
        assert output.num_batched_tokens == sum(new_tokens) <= config.max_num_batched_tokens
        assert self.scheduler.num_running <= config.max_num_seqs
        scheduled_ids = [item.request.request_id for item in output.scheduled]
        assert len(scheduled_ids) == len(set(scheduled_ids))
        if output.preempted_ids:
            self.preemption_steps += 1
            preempted = [self.requests[rid] for rid in output.preempted_ids]
            if len({r.tenant for r in self.requests.values()}) > 1:
                return  # the rules below are one tenant's; several tenants' preemptions follow fair share
            still_running = [r for r in self.requests.values() if r.status is RequestStatus.RUNNING]
            # Only the youngest are preempted: every survivor is older than every victim.
            assert all(r.arrival_order < p.arrival_order for r in still_running for p in preempted)
            assert set(scheduled_ids) <= running_before, "admitted a waiting request in a step that preempted"
            assert not set(scheduled_ids) & set(output.preempted_ids)
            assert all(p.status is RequestStatus.WAITING and p.num_computed_tokens == 0 and not p.block_ids
                       for p in preempted)


@dataclass(frozen=True)
class Spec:
    request_id: str
    arrival_step: int
    prompt: tuple[int, ...]
    max_tokens: int
    adapter: str | None
    abort_step: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    tenant: TenantTag = DEFAULT_TENANT


def play(config: EngineConfig, specs: list[Spec], max_steps: int, slot_table: AdapterSlotTable | None = None) -> Simulation:
    """Add each request at its arrival step, abort at its abort step, step until everything is done."""
    simulation = Simulation(config, slot_table)
    pending = sorted(specs, key=lambda spec: spec.arrival_step)
    aborts = {spec.request_id: spec.abort_step for spec in specs if spec.abort_step is not None}
    while pending or simulation.scheduler.has_unfinished():
        assert simulation.step_index < max_steps, f"unfinished after {max_steps} steps"
        while pending and pending[0].arrival_step <= simulation.step_index:
            spec = pending.pop(0)
            simulation.add(spec.request_id, list(spec.prompt), spec.max_tokens, spec.adapter, spec.stop_token_ids,
                           spec.tenant)
        for request_id, abort_step in aborts.items():
            if abort_step == simulation.step_index and request_id in simulation.requests:
                status = simulation.requests[request_id].status
                if simulation.scheduler.abort_request(request_id) is not None:
                    simulation.aborted_while[request_id] = status
        simulation.step()
    simulation.assert_everything_released()
    return simulation


UNCONSTRAINED = dict(num_kv_blocks=4096, max_num_seqs=1024, max_num_batched_tokens=1 << 16, max_loras=32)


def unconstrained_outputs(config: EngineConfig, specs: list[Spec]) -> dict[str, list[int]]:
    reference = EngineConfig(block_size=config.block_size, enable_prefix_caching=False, **UNCONSTRAINED)
    unhurried = [Spec(s.request_id, 0, s.prompt, s.max_tokens, s.adapter, None, s.stop_token_ids) for s in specs]
    return play(reference, unhurried, 10_000).outputs()


def assert_finishes_as_unconstrained(simulation: Simulation, config: EngineConfig, max_tokens: int) -> None:
    """Run the simulation's requests (all added at step 0, one budget) to the end; each must produce
    the tokens of an unconstrained run."""
    simulation.run_to_completion(max_steps=20)
    specs = [Spec(rid, 0, tuple(r.prompt_token_ids), max_tokens, None if r.adapter is None else r.adapter.name)
             for rid, r in simulation.requests.items()]
    assert simulation.outputs() == unconstrained_outputs(config, specs)


def random_specs(rng: random.Random, count: int, max_len: int, adapters: list[str | None], last_arrival: int,
                 abort_fraction: float, prefix_lengths: tuple[int, ...] = (4, 9, 13)) -> list[Spec]:
    shared_prefixes = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in prefix_lengths]
    specs = []
    for index in range(count):
        prompt = rng.choice(shared_prefixes) + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(0, 20))]
        max_tokens = rng.randrange(1, min(30, max_len - len(prompt)) + 1)
        arrival = rng.randrange(last_arrival)
        abort = arrival + rng.randrange(80) if rng.random() < abort_fraction else None
        specs.append(Spec(f"r{index}", arrival, tuple(prompt), max_tokens, rng.choice(adapters), abort, (STOP_TOKEN,)))
    return specs


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


# --------------------------------------------------------------------------- adapter slots
def test_slot_blocked_request_does_not_block_base_or_other_resident_adapters():
    config = EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=64, max_num_batched_tokens=256, max_loras=3)
    simulation = Simulation(config)
    # Fill the three slots; "a" is acquired first, so it is the slot to drain.
    simulation.add("a1", [1, 2, 3], max_tokens=4, adapter="a")
    simulation.add("b1", [1, 2, 3], max_tokens=20, adapter="b")
    simulation.add("c1", [1, 2, 3], max_tokens=20, adapter="c")
    simulation.step()
    blocked = simulation.add("d1", [4, 5, 6], max_tokens=3, adapter="d")
    base = simulation.add("base1", [4, 5, 6], max_tokens=3)
    resident = simulation.add("c2", [4, 5, 6], max_tokens=3, adapter="c")
    draining = simulation.add("a2", [4, 5, 6], max_tokens=3, adapter="a")
    simulation.step()
    assert base.status is RequestStatus.RUNNING and resident.status is RequestStatus.RUNNING
    assert blocked.status is RequestStatus.WAITING
    assert draining.status is RequestStatus.WAITING, "admitted onto the slot the blocked request waits for"
    while blocked.status is RequestStatus.WAITING:
        simulation.step()
    # d1 took a's slot the step after a's last running request finished.
    assert simulation.admitted_at["d1"] == simulation.finished_at["a1"] + 1
    assert simulation.slot_table.lookup("a@v1") is None and simulation.slot_table.lookup("d@v1") is not None
    simulation.run_to_completion(max_steps=100)


class NoReservationSlotTable(AdapterSlotTable):
    """The naive policy, for contrast: slot-blocked requests are skipped and nothing drains for them."""

    def drain_candidate(self) -> str | None:
        return None


def run_three_endless_streams(slot_table: AdapterSlotTable, stream_steps: int) -> tuple[Simulation, list[int]]:
    """Three adapters fill the three slots with a new request every step until `stream_steps`; one
    request for a fourth adapter, "x", arrives at step 3. Returns the simulation and, for each
    stream step in which x was still waiting, how many of that step's three newcomers were admitted."""
    config = EngineConfig(block_size=4, num_kv_blocks=512, max_num_seqs=128, max_num_batched_tokens=512, max_loras=3)
    simulation = Simulation(config, slot_table)
    newcomers_admitted_while_x_waits = []
    while simulation.step_index < stream_steps or simulation.scheduler.has_unfinished():
        assert simulation.step_index < stream_steps + 200
        step = simulation.step_index
        if step >= stream_steps:
            simulation.step()
            continue
        newcomers = [simulation.add(f"{key}{step}", [1, 2, 3, step % 9 + 1], 4, key) for key in ("a", "b", "c")]
        if step == 3:
            simulation.add("x", [9, 9, 9], max_tokens=4, adapter="x")
        simulation.step()
        if step >= 3 and "x" not in simulation.admitted_at:
            newcomers_admitted_while_x_waits.append(sum(r.request_id in simulation.admitted_at for r in newcomers))
    simulation.assert_everything_released()
    return simulation, newcomers_admitted_while_x_waits


def test_slot_blocked_request_is_served_despite_endless_streams_on_every_slot():
    longest = 4 + 4  # prompt + max_tokens of every stream request: steps a running request needs at most
    simulation, newcomers_admitted = run_three_endless_streams(AdapterSlotTable(3), stream_steps=60)
    assert simulation.admitted_at["x"] - simulation.added_at["x"] <= longest + 1
    # While x waited, only the draining adapter's newcomers were held back.
    assert newcomers_admitted and min(newcomers_admitted) == 2
    # The contrast: without the reservation the same workload starves x until the streams stop.
    naive, _ = run_three_endless_streams(NoReservationSlotTable(3), stream_steps=60)
    assert naive.admitted_at["x"] >= 60


def test_slot_pressure_ten_adapters_three_slots_every_request_within_its_bound():
    rng = random.Random(11)
    config = EngineConfig(block_size=4, num_kv_blocks=400, max_num_seqs=64, max_num_batched_tokens=256, max_loras=3)
    cold = [f"cold{i}" for i in range(9)]
    specs = []
    for index in range(40):  # one arrival per step; every third request is for the hot adapter
        adapter = "hot" if index % 3 == 0 else (None if index % 7 == 1 else rng.choice(cold))
        prompt = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 13)))
        specs.append(Spec(f"s{index}", index, prompt, rng.randrange(2, 9), adapter))
    longest = max(len(spec.prompt) + spec.max_tokens for spec in specs)
    simulation = play(config, specs, max_steps=40 + 41 * (longest + 1))

    by_id = {spec.request_id: spec for spec in specs}
    for spec in specs:
        request_id = spec.request_id
        waiting_ahead = sum(1 for other in specs if other.arrival_step < spec.arrival_step
                            and simulation.admitted_at[other.request_id] >= spec.arrival_step)
        wait = simulation.admitted_at[request_id] - simulation.added_at[request_id]
        assert wait <= (waiting_ahead + 1) * (longest + 1), request_id
        if by_id[request_id].adapter is None:
            assert wait == 0, f"base request {request_id} was held back by slot-blocked requests"
    assert any(simulation.admitted_at[s.request_id] > s.arrival_step for s in specs), "no slot pressure happened"
    assert simulation.outputs() == unconstrained_outputs(config, specs)


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
