"""The scheduler against a simulated model: the harness of test_scheduler*.py and test_fair_share.py.

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

    def run(self, step: SchedulerOutput) -> dict[str, list[int]]:
        """Each sampling request's tokens: the next one, or after a draft its accepted proposals and the next."""
        for slot, adapter in step.adapter_loads:
            self.slots[slot] = adapter.key
        for item in step.scheduled:
            request = item.request
            if request.adapter is None:
                assert item.slot == -1
            else:
                assert self.slots[item.slot] == request.adapter_key, "scheduled into a slot holding another adapter"
            start = request.num_computed_tokens
            computed = request.all_token_ids[start:start + item.num_new_tokens - len(item.draft)] + item.draft
            for position, token in enumerate(computed, start):
                block, offset = self._cell(request, position)
                self.kv[block][offset] = (token, request.cache_scope)
        sampled = {}
        for item in step.scheduled:
            request = item.request
            end = request.num_computed_tokens + item.num_new_tokens - len(item.draft)  # the known tokens' end
            assert item.sample == (end == request.num_tokens)
            assert not item.draft or item.sample, "a draft on a request that does not sample"
            seen = [self.kv[block][offset] for block, offset in (self._cell(request, p) for p in range(end))]
            expected = [(token, request.cache_scope) for token in request.all_token_ids[:end]]
            assert seen == expected, f"{request.request_id}: KV read through its block table differs from its tokens"
            if item.sample:
                context = [token for token, _ in seen]
                tokens = [next_token(request.request_id, context)]
                for proposal in item.draft:  # kept while the model agrees, as verify.py keeps them
                    if proposal != tokens[-1]:
                        break
                    context.append(proposal)
                    tokens.append(next_token(request.request_id, context))
                sampled[request.request_id] = tokens
        return sampled


class Simulation:
    """Scheduler + block manager + slot table + simulated model, with the engine's stop checks."""

    def __init__(self, config: EngineConfig, slot_table: AdapterSlotTable | None = None,
                 draft_rng: random.Random | None = None) -> None:
        self.config = config
        # With an rng: after each step every decoding request gets a draft of 0-5 tokens, the true
        # continuation with one token wrong at a random place (or none), as proposals are.
        self.draft_rng = draft_rng
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
        self.drafted_tokens = self.accepted_tokens = 0

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
                self.drafted_tokens += len(item.draft)
                self.accepted_tokens += len(sampled[request.request_id]) - 1
                self._stop_or_draft(request, len(sampled[request.request_id]))
        self.block_manager.check_invariants()
        self.step_index += 1
        return output

    def _stop_or_draft(self, request: Request, new_tokens: int) -> None:
        """The engine's stop checks over the step's new tokens, in order (tokens past a stop are dropped);
        a draft for the next step if it goes on."""
        params = request.sampling_params
        first = len(request.output_token_ids) - new_tokens
        for index in range(first, len(request.output_token_ids)):
            stopped = request.output_token_ids[index] in params.stop_token_ids
            if stopped or index + 1 >= params.max_tokens:
                del request.output_token_ids[index + 1:]
                status = RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_LENGTH
                self.scheduler.finish_request(request.request_id, status)
                self.finished_at[request.request_id] = self.step_index
                return
        if self.draft_rng is not None:
            request.draft_token_ids = self._draft(request)

    def _draft(self, request: Request) -> list[int]:
        rng = self.draft_rng
        context = request.all_token_ids
        draft = []
        for _ in range(rng.randint(0, 5)):
            draft.append(next_token(request.request_id, context + draft))
        if draft and rng.random() < 0.5:
            draft[rng.randrange(len(draft))] = rng.randrange(VOCAB)
        return draft

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


def play(config: EngineConfig, specs: list[Spec], max_steps: int, slot_table: AdapterSlotTable | None = None,
         draft_rng: random.Random | None = None) -> Simulation:
    """Add each request at its arrival step, abort at its abort step, step until everything is done."""
    simulation = Simulation(config, slot_table, draft_rng)
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


class NoReservationSlotTable(AdapterSlotTable):
    """The naive policy, for contrast: slot-blocked requests are skipped and nothing drains for them."""

    def drain_candidate(self) -> str | None:
        return None
