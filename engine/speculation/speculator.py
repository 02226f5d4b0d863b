"""The speculator: a draft for each decoding request after every step, and what became of the drafts.

Drafts come without a draft model, from two places: the request's own prompt and output (prompt lookup,
ngram_index.py), which pays on answers that quote or edit their prompt, and its (tenant, adapter)'s recent
answers (output_store.py), which pays on templated answers. The longer proposal of the two is taken.

How many tokens a request proposes adapts to what it gets accepted: a fully accepted draft doubles the
next one (up to the engine's speculative_max_tokens), a partly accepted one is cut to what was accepted
plus one, and a request whose drafts keep failing (open-ended chat) pauses drafting for a while, longer
each time, so that the rows it would verify in vain stay out of the batch.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from loraloom.engine.request import Request
from loraloom.engine.scheduler import SchedulerOutput
from loraloom.engine.speculation.ngram_index import NgramIndex
from loraloom.engine.speculation.output_store import OutputStore
from loraloom.engine.speculation.verify import StepTokens

FIRST_DRAFT_TOKENS = 3
MISSES_BEFORE_PAUSE = 3  # drafts in a row with nothing accepted
FIRST_PAUSE_STEPS = 8
LONGEST_PAUSE_STEPS = 128
# Tokens of context a proposer reads to match: the longest n-gram the indexes keep.
MATCH_CONTEXT = 4

Labels = tuple[str, str]  # (tenant, model), as the engine's metrics count requests


@dataclass(slots=True)
class _Drafting:
    """One request's own index and the state of its adaptive draft length."""

    index: NgramIndex
    length: int = FIRST_DRAFT_TOKENS
    misses: int = 0
    pause: int = FIRST_PAUSE_STEPS
    paused_until: int = 0  # the speculator's step count before which it does not draft


class Speculator:
    def __init__(self, max_tokens: int, max_model_len: int, labels: Callable[[Request], Labels],
                 store: OutputStore | None = None) -> None:
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.labels = labels  # the metrics' labels of a request (past the adapter cap: model "other")
        self.store = OutputStore() if store is None else store
        self._drafting: dict[str, _Drafting] = {}
        self._steps = 0
        # Per (tenant, model): verified drafts, their proposed tokens, the proposals accepted, and the
        # tokens the verifying steps emitted (the accepted ones and one more each).
        self.drafts: Counter[Labels] = Counter()
        self.draft_tokens: Counter[Labels] = Counter()
        self.accepted_tokens: Counter[Labels] = Counter()
        self.emitted_tokens: Counter[Labels] = Counter()

    def after_step(self, step: SchedulerOutput, sampled: StepTokens | None, ended: set[str]) -> None:
        """Count the step's verified drafts, keep the ended requests' answers, and draft for the others
        (`ended`: the ids of the requests that ended in the step)."""
        self._steps += 1
        if sampled is None:
            return
        for item, tokens in zip((item for item in step.scheduled if item.sample), sampled.token_ids):
            request = item.request
            drafting = self._drafting.get(request.request_id)
            if drafting is None:
                drafting = self._drafting[request.request_id] = _Drafting(NgramIndex(max_n=MATCH_CONTEXT))
                drafting.index.extend(request.prompt_token_ids)
            if item.draft:
                self._count(request, drafting, len(item.draft), len(tokens) - 1)
            if request.request_id in ended:
                self.finish(request)
                continue
            drafting.index.extend(tokens)
            request.draft_token_ids = self._propose(request, drafting)

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
        if accepted == proposed:
            drafting.length = min(2 * drafting.length, self.max_tokens)
        else:
            drafting.length = max(accepted + 1, 1)
        if accepted:
            drafting.misses, drafting.pause = 0, FIRST_PAUSE_STEPS
            return
        drafting.misses += 1
        if drafting.misses >= MISSES_BEFORE_PAUSE:
            drafting.paused_until = self._steps + drafting.pause
            drafting.pause = min(2 * drafting.pause, LONGEST_PAUSE_STEPS)
            drafting.misses, drafting.length = 0, FIRST_DRAFT_TOKENS

    def _propose(self, request: Request, drafting: _Drafting) -> list[int]:
        if self._steps < drafting.paused_until:
            return []
        # Room for the proposals and the token after them, within max_tokens and the context length.
        room = min(drafting.length, request.sampling_params.max_tokens - len(request.output_token_ids) - 1,
                   self.max_model_len - request.num_tokens - 1)
        if room <= 0:
            return []
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
