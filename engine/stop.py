"""When a request stops: stop strings in the text stream, and eos / stop tokens / length / a complete
grammar per token."""
from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from loraloom.engine.request import RequestStatus, SamplingParams

if TYPE_CHECKING:  # llguidance is imported by the requests that use a grammar, not by every stop check
    from loraloom.engine.structured_output import GrammarMatcher


class StopStringMatcher:
    """Filters a stream of text deltas so that nothing from a stop string onward is emitted.

    Text that could still become the start of a stop string is held back until the
    next delta settles it. The stop string itself is not emitted (OpenAI's behaviour);
    when generation ends for another reason, `flush` releases what was held back.
    """

    def __init__(self, stop: list[str]) -> None:
        if any(s == "" for s in stop):
            raise ValueError("stop: contains an empty string, which would match at once; remove it")
        self._stop = list(stop)
        self._longest = max((len(s) for s in self._stop), default=0)
        # Every proper prefix of every stop string: the held-back check is then one set lookup per length.
        self._proper_prefixes = {s[:length] for s in self._stop for length in range(1, len(s))}
        self._held = ""
        self._stopped = False

    def feed(self, delta: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was reached); after a stop, everything is dropped."""
        if self._stopped:
            return "", True
        pending = self._held + delta
        stop_at = self._earliest_stop(pending)
        if stop_at is not None:
            self._held = ""
            self._stopped = True
            return pending[:stop_at], True
        keep = self._partial_stop_suffix_len(pending)
        self._held = pending[len(pending) - keep :]
        return pending[: len(pending) - keep], False

    def flush(self) -> str:
        """The held-back text, once no more deltas will come (generation ended by eos or length)."""
        held, self._held = self._held, ""
        return held

    def _earliest_stop(self, text: str) -> int | None:
        # Earliest start wins: with stops "abc" and "bcd", text "abcd" stops before "a".
        starts = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(starts, default=None)

    def _partial_stop_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        for length in range(min(len(text), self._longest - 1), 0, -1):
            if text[len(text) - length :] in self._proper_prefixes:
                return length
        return 0


def stopping_token_ids(params: SamplingParams, eos_token_ids: Collection[int]) -> frozenset[int]:
    """The tokens that end a request: its stop_token_ids, and the model's eos unless it ignores eos.
    min_tokens masks the same set until it is reached (engine/logit_adjustments.py)."""
    stopping = set(params.stop_token_ids)
    if not params.ignore_eos:
        stopping.update(eos_token_ids)
    return frozenset(stopping)


class TokenStops:
    """A request's per-token finish rule: eos (unless ignore_eos) and stop token ids give "stop",
    reaching max_tokens gives "length" (RequestStatus values). Stop strings are checked on the text
    by StopStringMatcher. Built once per request, so the check per sampled token is a set lookup."""

    __slots__ = ("stop_token_ids", "max_tokens")

    def __init__(self, params: SamplingParams, eos_token_ids: Collection[int]) -> None:
        self.stop_token_ids = stopping_token_ids(params, eos_token_ids)
        self.max_tokens = params.max_tokens

    def check(self, token_id: int, num_output_tokens: int) -> str | None:
        """The finish reason that output token `token_id`, the request's `num_output_tokens`-th, causes, or None."""
        if token_id in self.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED.value
        if num_output_tokens >= self.max_tokens:
            return RequestStatus.FINISHED_LENGTH.value
        return None


class GrammarTokenStops(TokenStops):
    """TokenStops for a request with a grammar: each token advances the matcher first, and the
    request stops as soon as the grammar is complete (nothing but end-of-sequence could follow)."""

    __slots__ = ("matcher",)

    def __init__(self, params: SamplingParams, eos_token_ids: Collection[int], matcher: GrammarMatcher) -> None:
        super().__init__(params, eos_token_ids)
        self.matcher = matcher

    def check(self, token_id: int, num_output_tokens: int) -> str | None:
        self.matcher.accept(token_id)
        reason = super().check(token_id, num_output_tokens)
        if reason is None and self.matcher.finished:
            return "stop"
        return reason
