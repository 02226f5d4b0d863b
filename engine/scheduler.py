"""Continuous-batching scheduler (pure Python, no torch).

One rule drives every step: each request's computed tokens catch up with its
known tokens (`num_computed_tokens` -> `num_tokens`). A prefill, a prefill
chunk, a decode and the recompute after a preemption are the same loop; a
step that reaches `num_tokens` samples the next token.

A step, under a token budget (`max_num_batched_tokens`) and a sequence limit
(`max_num_seqs`):

0. Fair share (policy "fair", the default; engine/fair_share.py). Each tenant
   has a virtual token counter, charged its tokens / its weight; waiting
   requests are admitted smallest counter first (oldest first within a tenant).
   When the request admission serves next finds no free sequence or not enough
   free blocks, running requests of tenants over their share are preempted by
   recompute (as in 1), youngest first, but only if that frees enough for it,
   only from a tenant that keeps a request running, and only from a tenant
   that holds more sequences per weight than the waiting tenant would after
   the move or is ahead by more than a request's worth: the reverse move then
   needs the counters to cross by that margin again, so requests do not
   thrash. Policy "fcfs" skips this and admits oldest first whoever asks; with
   a single tenant both policies schedule exactly alike.
1. Running requests, oldest first. Each takes what it still has to compute,
   capped so that one token per younger running request stays in the budget:
   a long prefill is chunked and never stalls the decodes beside it. When a
   request needs a KV block and none is free, the youngest running request
   (possibly itself) is preempted by recompute: its blocks and slot reference
   are released and it returns to the waiting queue with its arrival order,
   so it keeps its priority. Under fair share the victim is the youngest
   request, not yet scheduled this step, of the tenant with the largest counter.
2. If nothing was preempted in 1, waiting requests are admitted (in fair-share
   order, or oldest first) while budget, sequences, KV blocks and adapter
   slots allow. Running out of blocks stops admission (no request overtakes
   the one admission serves on memory).
   A waiting request whose next prefix blocks a running request is computing
   right now (same tokens, same adapter) waits for them instead of computing
   them too: requests that arrive together behind one long system prompt
   compute it once (SGLang's in-batch prefix caching does the same). The wait
   is bounded by that prefill, which runs every step.
3. Drafts (speculative decoding, engine/speculation/): what the step has left
   (budget, sampled rows up to max_num_seqs, free blocks) goes to decoding
   requests' proposed tokens, oldest first, verified in the same forward.

Adapter slots (the number of distinct adapters in a step). A waiting request
whose adapter is not resident and finds every slot in use is *slot-blocked*:
it is skipped, so base requests and requests for resident adapters behind it
still run. So that it cannot starve, the oldest slot-blocked request reserves
the slot that would be freed first, the in-use slot acquired least recently
(`AdapterSlotTable.drain_candidate`): no younger request is admitted onto
that adapter, its running requests finish, its reference count reaches 0 and
the blocked request, being older than everything admitted since, takes the
slot at the next admission. Its wait is therefore bounded by the time the
draining adapter's running requests need to finish. Under fair share "oldest"
reads "first in admission order": another tenant with a smaller counter may
take the freed slot first, but its counter then grows while the blocked
tenant's does not, so the blocked request's turn still comes.
"""
from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from loraloom.engine.lora.slots import AdapterSlotTable
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.fair_share import FairShare, TenantLoad
from loraloom.engine.kv_cache import BlockManager
from loraloom.engine.request import Request, RequestStatus

BASE_SLOT = -1
# A waiting request waits for a running one's prefill when at least this many tokens of its prefix are
# being computed: below it, the step of delay costs more than the recomputation it saves.
MIN_SHARED_INFLIGHT_TOKENS = 32


@dataclass(slots=True)  # one per running request per step: slots make it cheaper to build
class ScheduledRequest:
    request: Request
    # Computes tokens [request.num_computed_tokens, + num_new_tokens) of request.all_token_ids.
    num_new_tokens: int
    slot: int  # adapter slot of every new token; BASE_SLOT (-1) for the base model
    sample: bool  # the step reaches request.num_tokens: sample the next token from its last row
    # Proposed tokens computed after its last known token (counted in num_new_tokens): the step samples
    # one row more per proposal and keeps the proposals the model agrees with (engine/speculation/).
    draft: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    adapter_loads: list[tuple[int, AdapterHandle]]  # (slot, adapter) to copy in before the step runs
    preempted_ids: list[str]
    num_batched_tokens: int
    # Row request.block_row holds each scheduled request's block ids, zero-padded (engine/block_rows.py).
    block_table: np.ndarray

    @cached_property
    def sampled_requests(self) -> list[Request]:
        """The scheduled requests with sample=True, in scheduled order: one sampled token each."""
        return [item.request for item in self.scheduled if item.sample]


def _arrival(request: Request) -> int:
    return request.arrival_order


def _slot_of(item: ScheduledRequest) -> int:
    return item.slot


def _count_by_adapter(requests: list[Request]) -> dict[tuple[str, str], int]:
    return dict(Counter(r.metrics_labels for r in requests))


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, slot_table: AdapterSlotTable) -> None:
        if config.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {config.max_num_batched_tokens}")
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {config.max_num_seqs}")
        if block_manager.block_size != config.block_size:
            raise ValueError(f"block_size: the block manager uses {block_manager.block_size}, the config "
                             f"{config.block_size}; build both from the same EngineConfig")
        self.config = config
        self.block_manager = block_manager
        self.slot_table = slot_table
        self._waiting: list[Request] = []  # by arrival_order, oldest first
        self._running: list[Request] = []  # by arrival_order, oldest first
        self._requests: dict[str, Request] = {}  # every unfinished request, waiting or running
        # Per-tenant accounts, kept under either policy (the stats read them); "fair" also orders by them.
        self.fair_share = FairShare()
        self._fair = config.scheduling_policy == "fair"

    # ------------------------------------------------------------------ queue
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def running_adapter_counts(self) -> dict[tuple[str, str], int]:
        """(tenant, adapter name) -> requests, in the order of their oldest request (as the waiting counts)."""
        return _count_by_adapter(self._running)

    def waiting_adapter_counts(self) -> dict[tuple[str, str], int]:
        return _count_by_adapter(self._waiting)

    def tenant_loads(self) -> dict[str, TenantLoad]:
        """Per tenant name: queued and running requests, served tokens, fair-share counter (thread-safe)."""
        return self.fair_share.loads()

    def add_request(self, request: Request) -> None:
        """Queue a request LLMEngine.validate_request accepted (it has a prompt)."""
        if request.request_id in self._requests:
            raise ValueError(f"request_id: {request.request_id!r} is already scheduled; use a unique id")
        if request.adapter is not None and self.slot_table.num_slots == 0:
            raise ValueError(f"adapter: this engine has max_loras=0 adapter slots; "
                             f"raise max_loras to serve adapter {request.adapter.name!r}")
        request.status = RequestStatus.WAITING
        bisect.insort(self._waiting, request, key=_arrival)
        self.fair_share.enqueue(request, arriving=True)
        self._requests[request.request_id] = request

    def abort_request(self, request_id: str) -> Request | None:
        """Remove a waiting or running request and free what it holds; None if unknown or already finished."""
        request = self._remove(request_id)
        if request is not None:
            request.status = RequestStatus.FINISHED_ABORTED
        return request

    def finish_request(self, request_id: str, status: RequestStatus) -> None:
        if not status.finished:
            raise ValueError(f"status: finish_request needs a finished status, got {status}")
        request = self._remove(request_id)
        if request is None:
            raise ValueError(f"request_id: {request_id!r} is not waiting or running in the scheduler")
        request.status = status

    # ------------------------------------------------------------------- step
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        # Preempted for another tenant's share (rule 0 of the module docstring): admission still runs.
        rebalanced = self._preempt_for_fair_share() if self._fair and self._waiting else []
        index = 0
        # This loop runs once per running request every step (hundreds): it reads each request's
        # fields directly, and asks the block manager only when the request's blocks are full.
        block_size = self.block_manager.block_size
        running = self._running
        num_running = len(running)
        while index < num_running and budget > 0:
            request = running[index]
            computed = request.num_computed_tokens
            remaining = len(request.prompt_token_ids) + len(request.output_token_ids) - computed
            cap = budget - (num_running - index - 1)  # leave one token for each younger request
            num_new = remaining if remaining <= cap else (cap if cap > 1 else 1)
            if computed + num_new > len(request.block_ids) * block_size:
                if not self.block_manager.ensure_capacity(request, num_new):
                    made_room = self._make_room(request, num_new, index, preempted)
                    num_running = len(running)
                    if not made_room:
                        continue  # it preempted itself: the request after it (if any) now sits at `index`
            scheduled.append(ScheduledRequest(request, num_new, request.adapter_slot, num_new == remaining))
            budget -= num_new
            index += 1

        adapter_loads: list[tuple[int, AdapterHandle]] = []
        # A step that had to preempt is short of blocks: admitting now would
        # only preempt again (or re-admit the victims).
        if not preempted:
            budget = self._admit_waiting(budget, scheduled, adapter_loads)
        budget = self._add_drafts(scheduled, budget)
        # Each adapter's requests side by side: its tokens become one contiguous run of rows of the
        # flat batch, which the LoRA kernels take as a view instead of gathering and scattering rows.
        # Stable, so requests keep their age order within an adapter (and base requests come first).
        scheduled.sort(key=_slot_of)
        return SchedulerOutput(
            scheduled=scheduled,
            adapter_loads=adapter_loads,
            preempted_ids=[request.request_id for request in rebalanced + preempted],
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            block_table=self.block_manager.rows.array,
        )

    def update_after_step(self, output: SchedulerOutput, sampled_token_ids: list[list[int]]) -> None:
        """Advance the scheduled requests by what the step computed and append their sampled tokens.

        `sampled_token_ids` holds, per scheduled request with `sample=True` in scheduled order, the tokens
        the step produced: one, or for a request that verified a draft its accepted proposals and the token
        after them. Proposals that were not accepted are not computed: their KV slots are written over later.
        """
        num_sampled = len(output.sampled_requests)
        if len(sampled_token_ids) != num_sampled:
            raise ValueError(f"sampled_token_ids: got tokens for {len(sampled_token_ids)} requests, but this step "
                             f"scheduled {num_sampled} with sample=True; pass one list per request, in order")
        block_size = self.block_manager.block_size
        requests = self._requests
        charge_output = self.fair_share.charge_output
        sampled_index = 0
        for item in output.scheduled:
            request = item.request
            if requests.get(request.request_id) is not request:
                sampled_index += item.sample
                continue  # aborted between schedule() and now; its blocks are already freed
            computed = request.num_computed_tokens
            tokens = sampled_token_ids[sampled_index] if item.sample else ()
            # A verified draft computed its last token and the proposals; only the accepted ones
            # (all but the step's last new token) count as computed.
            now_computed = computed + (item.num_new_tokens if not item.draft else len(tokens))
            request.num_computed_tokens = now_computed
            if item.sample:
                request.output_token_ids.extend(tokens)
                # The tokens it got: a draft's rejected proposals are not charged (the speculator drafts only
                # where a proposal is likely to pay, so they stay a small share of what a tenant gets).
                charge_output(request, len(tokens))
                sampled_index += 1
            if now_computed // block_size != computed // block_size:
                self.block_manager.commit(request)  # a block became full: register its prefix hash

    # -------------------------------------------------------------- internals
    def _add_drafts(self, scheduled: list[ScheduledRequest], budget: int) -> int:
        """Give the decoding requests' drafts (oldest first) what the step has left once every request's own
        work is scheduled: the token budget, sampled rows up to max_num_seqs (what the memory plan sized a
        step's logits for) and free KV blocks. Speculation never delays nor preempts anyone. Returns the
        budget left."""
        rows_left = self.config.max_num_seqs - len(scheduled)
        for item in scheduled:
            if budget <= 0 or rows_left <= 0:
                break
            request = item.request
            if not request.draft_token_ids or item.num_new_tokens != 1 or not item.sample:
                continue
            draft = request.draft_token_ids[:min(budget, rows_left)]
            if not self.block_manager.ensure_capacity(request, 1 + len(draft)):
                continue
            item.draft = draft
            item.num_new_tokens += len(draft)
            budget -= len(draft)
            rows_left -= len(draft)
        return budget

    def _admission_order(self) -> Iterator[Request]:
        """Waiting requests in the order admission considers them: by fair share, or oldest first."""
        return self.fair_share.admission_order() if self._fair else iter(list(self._waiting))

    def _candidates(self) -> Iterator[Request]:
        """The waiting requests admission may take now, in its order: slot-blocked requests, requests
        for the adapter reserved for them, and requests whose prefix a running request is computing are
        passed over (module docstring). Capacity (budget, sequences, blocks) is the consumer's to check."""
        draining_key: str | None = None  # reserved for the first slot-blocked request (module docstring)
        for request in self._admission_order():
            key = request.adapter_key
            if key is not None:
                if not self.slot_table.can_acquire(key):
                    if draining_key is None:
                        draining_key = self.slot_table.drain_candidate()
                    continue
                if key == draining_key:
                    continue
            if self.block_manager.inflight_prefix_tokens(request) >= MIN_SHARED_INFLIGHT_TOKENS:
                continue  # its prefix is being computed by a running request: reuse it next step
            yield request

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest],
                       adapter_loads: list[tuple[int, AdapterHandle]]) -> int:
        """Admit waiting requests in admission order; return the budget left."""
        if budget == 0 or len(self._running) >= self.config.max_num_seqs:
            return budget
        for request in self._candidates():
            if not self.block_manager.allocate_for_new(request):
                break
            key = request.adapter_key
            slot = BASE_SLOT
            if key is not None:
                slot, needs_load = self.slot_table.acquire(key)
                if needs_load:
                    adapter_loads.append((slot, request.adapter))
            request.adapter_slot = slot  # fixed while it runs: a slot with references is never evicted
            self._waiting.remove(request)
            self.fair_share.dequeue(request)
            self.fair_share.admitted(request)
            request.status = RequestStatus.RUNNING
            bisect.insort(self._running, request, key=_arrival)
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            scheduled.append(self._scheduled(request, num_new, slot))
            budget -= num_new
            if budget == 0 or len(self._running) >= self.config.max_num_seqs:
                break
        return budget

    def _preempt_for_fair_share(self) -> list[Request]:
        """Rule 0 (module docstring): when the request admission serves next finds no free sequence or
        not enough free blocks, preempt running requests of tenants over their share, youngest first,
        if that frees enough for it; else nothing. Returns the preempted requests."""
        if not self._running:
            return []
        waiting = next(self._candidates(), None)
        if waiting is None:
            return []
        free_seqs = self.config.max_num_seqs - len(self._running)
        short_blocks = self.block_manager.blocks_to_admit(waiting) - self.block_manager.num_free_blocks
        if free_seqs > 0 and short_blocks <= 0:
            return []  # admission takes it as it is
        planned: dict[str, int] = {}
        victims: list[Request] = []
        while free_seqs <= 0 or short_blocks > 0:
            youngest: dict[str, Request] = {}
            for request in reversed(self._running):
                if request.tenant.id not in youngest and request not in victims:
                    youngest[request.tenant.id] = request
            victim = self.fair_share.preemption_victim(waiting, youngest, planned)
            if victim is None:
                return []  # what would go does not make room: preempt nothing rather than in vain
            planned[victim.tenant.id] = planned.get(victim.tenant.id, 0) + 1
            victims.append(victim)
            free_seqs += 1
            short_blocks -= self.block_manager.blocks_freed_by(victim)
        for victim in victims:
            self._preempt(victim)
        return victims

    def _make_room(self, request: Request, num_new: int, index: int, preempted: list[Request]) -> bool:
        """Preempt running requests not yet scheduled this step (those from `index`, `request` first)
        until `request` has blocks for `num_new` tokens: the youngest, or under fair share the youngest
        of the tenant with the largest counter among them. Returns False when `request` itself had to go."""
        while not self.block_manager.ensure_capacity(request, num_new):
            victim = self._pressure_victim(index)
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _pressure_victim(self, index: int) -> Request:
        running = self._running
        if not self._fair:
            return running[-1]
        counter = self.fair_share.counter
        victim, most = running[-1], counter(running[-1])
        for candidate in reversed(running[index:-1]):  # youngest first: a tie keeps the younger
            served = counter(candidate)
            if served > most:
                victim, most = candidate, served
        return victim

    def _preempt(self, request: Request) -> None:
        self._running.remove(request)
        self._release(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        bisect.insort(self._waiting, request, key=_arrival)
        self.fair_share.enqueue(request, arriving=False)

    def _remove(self, request_id: str) -> Request | None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self._running.remove(request)
            self._release(request)
        else:
            self._waiting.remove(request)
            self.fair_share.dequeue(request)
        return request

    def _release(self, request: Request) -> None:
        """Give back a running request's KV blocks and its adapter slot reference."""
        self.fair_share.stopped_running(request)
        self.block_manager.free(request)
        if request.adapter_key is not None:
            self.slot_table.release(request.adapter_key)
        request.adapter_slot = BASE_SLOT

    @staticmethod
    def _scheduled(request: Request, num_new: int, slot: int) -> ScheduledRequest:
        reaches_end = request.num_computed_tokens + num_new == request.num_tokens
        return ScheduledRequest(request, num_new, slot, sample=reaches_end)
