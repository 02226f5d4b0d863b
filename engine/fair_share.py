"""Fair share across tenants in tokens: the Virtual Token Counter (VTC) of "Fairness in Serving Large
Language Models" (Sheng et al., OSDI 2024), the bookkeeping the scheduler asks (pure Python, no torch).

Each tenant (TenantTag.id) has an account whose counter measures the service it received, in tokens
divided by its weight:

- charging: a request's prompt tokens when it is first admitted, each output token when it is sampled.
  A request re-admitted after a preemption is not charged again: recomputing it is the engine's choice,
  and its tenant received nothing new. Prompt tokens served from the prefix cache are charged like the
  others, so a counter says nothing about whether a prompt was cached.
- the lift (the paper's counter lift, so that idle time is not banked): a tenant that becomes backlogged
  (a request arrives while it has none waiting) has its counter raised to the smallest counter of the
  tenants already backlogged, or, with none backlogged, to the counter of the tenant whose queue emptied
  last. A tenant that was idle starts level with the others, not ahead of them by all it did not use.
- the order: admission serves the backlogged tenant with the smallest counter, oldest request first
  within a tenant. Equal counters (a tenant just lifted to another's) go to the tenant running fewer
  requests per weight, then to the older head request. With a single tenant this is exactly oldest first.

Counters only grow. An account is kept for every tenant seen (tenants are created by the operator, so
their number is bounded); the stats list each one: queued and running requests, served tokens, counter.
"""
from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from loraloom.engine.request import Request
from loraloom.engine.tenancy import TenantTag


def _arrival(request: Request) -> int:
    return request.arrival_order


def _worth(request: Request, tag: TenantTag) -> float:
    """What running a request to its end may charge its tenant's counter."""
    return (len(request.prompt_token_ids) + request.sampling_params.max_tokens) / tag.weight


@dataclass(slots=True)
class TenantAccount:
    tag: TenantTag  # the latest tag seen for this id: the operator may change a weight at any time
    counter: float = 0.0  # virtual tokens: service received / weight, plus lifts
    waiting: list[Request] = field(default_factory=list)  # by arrival_order, oldest first
    num_running: int = 0
    served_tokens: int = 0  # prompt tokens at first admission + output tokens, unweighted

    def charge(self, tokens: int) -> None:
        self.counter += tokens / self.tag.weight
        self.served_tokens += tokens


@dataclass(frozen=True)
class TenantLoad:
    """One tenant's line of the engine's stats (EngineStats' per-tenant dicts)."""

    queued: int
    running: int
    served_tokens: int
    share_counter: float


class FairShare:
    def __init__(self) -> None:
        self._accounts: dict[str, TenantAccount] = {}
        self._backlogged: dict[str, TenantAccount] = {}  # accounts with waiting requests
        self._last_left: TenantAccount | None = None  # the account whose waiting queue emptied last

    def account(self, request: Request) -> TenantAccount:
        tag = request.tenant
        account = self._accounts.get(tag.id)
        if account is None:
            account = self._accounts[tag.id] = TenantAccount(tag)
        elif account.tag is not tag:
            account.tag = tag
        return account

    # ------------------------------------------------------------------ queue changes
    def enqueue(self, request: Request, arriving: bool) -> None:
        """`request` joins the waiting queue: it arrived (`arriving`: the lift applies), or was preempted."""
        account = self.account(request)
        if not account.waiting:
            if arriving:
                self._lift(account)
            self._backlogged[request.tenant.id] = account
        bisect.insort(account.waiting, request, key=_arrival)

    def dequeue(self, request: Request) -> None:
        """`request` left the waiting queue (admitted or aborted)."""
        account = self._accounts[request.tenant.id]
        account.waiting.remove(request)
        if not account.waiting:
            del self._backlogged[request.tenant.id]
            self._last_left = account

    def admitted(self, request: Request) -> None:
        account = self._accounts[request.tenant.id]
        account.num_running += 1
        if request.num_preemptions == 0:
            account.charge(len(request.prompt_token_ids))

    def stopped_running(self, request: Request) -> None:
        """`request` stopped running: preempted, finished or aborted."""
        self._accounts[request.tenant.id].num_running -= 1

    def charge_output(self, request: Request, tokens: int = 1) -> None:
        self._accounts[request.tenant.id].charge(tokens)

    def _lift(self, account: TenantAccount) -> None:
        if self._backlogged:
            floor = min(other.counter for other in self._backlogged.values())
        elif self._last_left is not None:
            floor = self._last_left.counter
        else:
            return
        if account.counter < floor:
            account.counter = floor

    # ---------------------------------------------------------------------- reads
    def counter(self, request: Request) -> float:
        return self._accounts[request.tenant.id].counter

    def admission_order(self) -> Iterator[Request]:
        """Every waiting request, smallest counter first, oldest first within a tenant. Lazy: the consumer
        admits (and so charges) each request before asking for the next, and the next choice sees the
        charge. Each tenant's queue is copied when first reached, so admitting from it is safe meanwhile."""
        heap = [(account.counter, account.num_running / account.tag.weight, account.waiting[0].arrival_order,
                 tenant_id, 0) for tenant_id, account in self._backlogged.items()]
        heapq.heapify(heap)
        queues: dict[str, list[Request]] = {}
        while heap:
            *_, tenant_id, index = heapq.heappop(heap)
            queue = queues.get(tenant_id)
            if queue is None:
                queue = queues[tenant_id] = list(self._backlogged[tenant_id].waiting)
            yield queue[index]
            index += 1
            if index < len(queue):
                account = self._accounts[tenant_id]
                heapq.heappush(heap, (account.counter, account.num_running / account.tag.weight,
                                      queue[index].arrival_order, tenant_id, index))

    def preemption_victim(self, waiting: Request, youngest: dict[str, Request],
                          planned: dict[str, int]) -> Request | None:
        """The running request to preempt so that `waiting` (the request admission serves next, which finds
        no free capacity) can run, or None. `youngest`: each running tenant's youngest running request not
        already chosen; `planned`: victims already chosen per tenant id. The victim is the youngest request
        of the running tenant with the largest counter, at least `waiting`'s tenant's, that keeps a request
        of its own and is

        - over its share of sequences: with the move it would still hold more per weight than `waiting`'s
          tenant, so the move evens the split and the same rule cannot move it back; or
        - ahead by more than one request's worth (prompt + max_tokens, weighted; the larger of `waiting`
          and the victim): running `waiting` to the end cannot take its tenant past the victim's, nor can
          the victim's re-admission take it past `waiting`'s.

        Either way the reverse move needs the counters to cross by that margin first: no thrashing."""
        mine = self._accounts[waiting.tenant.id]
        my_running = mine.num_running + 1  # with `waiting` admitted
        my_worth = _worth(waiting, mine.tag)
        best: Request | None = None
        best_counter = 0.0
        for tenant_id, request in youngest.items():
            account = self._accounts[tenant_id]
            running = account.num_running - planned.get(tenant_id, 0)
            if account is mine or running < 2 or account.counter < mine.counter:
                continue
            over_share = (running - 1) / account.tag.weight > my_running / mine.tag.weight
            ahead = account.counter - mine.counter > max(my_worth, _worth(request, account.tag))
            if (over_share or ahead) and (best is None or account.counter > best_counter):
                best, best_counter = request, account.counter
        return best

    def loads(self) -> dict[str, TenantLoad]:
        """Per tenant name (the metrics label); any thread may read it (a scrape does), so the accounts are
        copied first in one step that the step thread cannot interleave with."""
        loads: dict[str, TenantLoad] = {}
        for account in list(self._accounts.values()):
            name = account.tag.name
            load = TenantLoad(len(account.waiting), account.num_running, account.served_tokens, account.counter)
            previous = loads.get(name)
            if previous is not None:  # two ids under one name (a renamed tenant): one line, summed
                load = TenantLoad(previous.queued + load.queued, previous.running + load.running,
                                  previous.served_tokens + load.served_tokens,
                                  max(previous.share_counter, load.share_counter))
            loads[name] = load
        return loads
