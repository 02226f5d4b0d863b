"""The speculator: a draft for each decoding request after every step, and what became of the drafts.

Drafts come without a draft model, from two places: the request's own prompt and output (prompt lookup,
ngram_index.py), which pays on answers that quote or edit their prompt, and its (tenant, adapter)'s recent
answers (output_store.py), which pays on templated answers. The longer proposal of the two is taken.

A proposed token costs a row in the next step, paid by every request in it, and pays only if accepted.
So each request keeps an estimate of its chance that a proposal is accepted (what its drafts got accepted,
recent ones weighing more), and the engine's measured cost of a row (step_cost.py) sets the price: the
request drafts as many tokens as have a chance above the rows' share of the step time (the k-th token of a
draft is accepted only if all before it were: chance**k). A request whose chance falls below the price
(open-ended chat on a busy CPU) stops drafting for a pause, longer each time, then starts again from the
prior chance, in case its answer turned to quoting.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from loraloom.engine.request import Request
from loraloom.engine.scheduler import SchedulerOutput
from loraloom.engine.speculation.ngram_index import NgramIndex
from loraloom.engine.speculation.output_store import OutputStore
from loraloom.engine.speculation.step_cost import StepCost
from loraloom.engine.speculation.verify import StepTokens

# A new request's chance that a proposal is accepted: `PRIOR_ACCEPTED` of `PRIOR_TESTED` proposals.
PRIOR_ACCEPTED, PRIOR_TESTED = 1.0, 2.0
# Each verified draft's weight in the chance decays by this factor per later draft.
DECAY = 0.7
FIRST_PAUSE_STEPS = 8
LONGEST_PAUSE_STEPS = 128
# Tokens of context a proposer reads to match: the longest n-gram the indexes keep.
MATCH_CONTEXT = 4

Labels = tuple[str, str]  # (tenant, model), as the engine's metrics count requests


@dataclass(slots=True)
class _Drafting:
    """One request's own index and its chance that a proposal is accepted."""

    index: NgramIndex
    accepted: float = PRIOR_ACCEPTED  # decayed sums over its verified drafts: proposals accepted,
    tested: float = PRIOR_TESTED  # and proposals the verification reached (it stops at the first miss)
    pause: int = FIRST_PAUSE_STEPS
    paused_until: int = 0  # the speculator's step count before which it does not draft

    @property
    def chance(self) -> float:
        return self.accepted / self.tested


class Speculator:
    def __init__(self, max_tokens: int, max_model_len: int, labels: Callable[[Request], Labels],
                 store: OutputStore | None = None) -> None:
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.labels = labels  # the metrics' labels of a request (past the adapter cap: model "other")
        self.store = OutputStore() if store is None else store
        self.step_cost = StepCost()
        self._drafting: dict[str, _Drafting] = {}
        self._steps = 0
        # Per (tenant, model): verified drafts, their proposed tokens, the proposals accepted, and the
        # tokens the verifying steps emitted (the accepted ones and one more each).
        self.drafts: Counter[Labels] = Counter()
        self.draft_tokens: Counter[Labels] = Counter()
        self.accepted_tokens: Counter[Labels] = Counter()
        self.emitted_tokens: Counter[Labels] = Counter()

    def after_step(self, step: SchedulerOutput, sampled: StepTokens | None, ended: set[str], model_s: float) -> None:
        """Count the step's verified drafts, keep the ended requests' answers, and draft for the others
        (`ended`: the ids of the requests that ended in the step; `model_s`: the step's model time)."""
        self._steps += 1
        if sampled is None:
            return
        self.step_cost.observe(step.num_batched_tokens, model_s)
        price = self.step_cost.row_share(len(sampled.token_ids))
        for item, tokens in zip((item for item in step.scheduled if item.sample), sampled.token_ids):
            request = item.request
            drafting = self._drafting.get(request.request_id)
            if drafting is None:
                drafting = self._drafting[request.request_id] = _Drafting(NgramIndex(max_n=MATCH_CONTEXT))
            if item.draft:
                self._count(request, drafting, len(item.draft), len(tokens) - 1)
            if request.request_id in ended:
                self.finish(request)
                continue
            request.draft_token_ids = self._propose(request, drafting, price)

    def finish(self, request: Request) -> None:
        """Forget an ended request; keep a finished answer for its (tenant, adapter)'s later drafts."""
        if self._drafting.pop(request.request_id, None) is not None and request.output_token_ids:
            self.store.record(_scope(request), request.prompt_token_ids, request.output_token_ids)
        request.draft_token_ids = []

    def forget(self, request_id: str) -> None:
        """Drop an aborted request's state (its answer is not kept: it may be cut anywhere)."""
        self._drafting.pop(request_id, None)

    def _count(self, request: Request, drafting: _Drafting, proposed: int, accepted: int) -> None:
        labels = self.labels(request)
        self.drafts[labels] += 1
        self.draft_tokens[labels] += proposed
        self.accepted_tokens[labels] += accepted
        self.emitted_tokens[labels] += accepted + 1
        reached = accepted + (accepted < proposed)  # the verification stops at the first miss
        drafting.accepted = DECAY * drafting.accepted + accepted
        drafting.tested = DECAY * drafting.tested + reached
        if accepted:
            drafting.pause = FIRST_PAUSE_STEPS

    def _propose(self, request: Request, drafting: _Drafting, price: float) -> list[int]:
        """The request's next draft: as many tokens as are each likelier to be accepted than `price` (the
        share of a step's time its rows take), within max_tokens and the context; [] while it pauses."""
        if self._steps < drafting.paused_until:
            return []
        chance = drafting.chance
        if chance <= price:
            # Not worth a row now: pause, then try again from the prior chance.
            drafting.paused_until = self._steps + drafting.pause
            drafting.pause = min(2 * drafting.pause, LONGEST_PAUSE_STEPS)
            drafting.accepted, drafting.tested = PRIOR_ACCEPTED, PRIOR_TESTED
            return []
        worth = self.max_tokens if chance >= 1.0 or price <= 0.0 else int(math.log(price) / math.log(chance))
        room = min(worth, self.max_tokens, request.sampling_params.max_tokens - len(request.output_token_ids) - 1,
                   self.max_model_len - request.num_tokens - 1)
        if room <= 0:
            return []
        # Indexed only when it drafts: at a price nothing pays (a big batch on a CPU), a step costs each
        # request a comparison, not the index's upkeep.
        indexed, known = len(drafting.index), request.num_tokens
        if indexed < known:
            drafting.index.extend(request.token_ids_between(indexed, known))
        own = drafting.index.propose(room)
        stored, _ = self.store.propose(_scope(request), _recent(request), room)
        return stored if len(stored) > len(own) else own


def _scope(request: Request) -> tuple[str, str | None]:
    """Whose answers a request's drafts may come from: its tenant's, for its adapter (or the base model)."""
    return request.tenant.id, request.adapter_key


def _recent(request: Request) -> list[int]:
    """The request's last MATCH_CONTEXT tokens, prompt then output."""
    output = request.output_token_ids
    if len(output) >= MATCH_CONTEXT:
        return output[-MATCH_CONTEXT:]
    return request.prompt_token_ids[len(output) - MATCH_CONTEXT:] + output
