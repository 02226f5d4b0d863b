"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of a request's last n-gram.

A request often repeats its own text (code edits, quoting, summaries of the prompt), so the tokens that
followed the last time its current suffix appeared are a cheap, often-right guess of what comes next.

The index maps each n-gram (n in [min_n, max_n]) to the end position of its latest occurrence, built
incrementally as the sequence grows: `extend` runs every engine step for every running request, so it
does a constant amount of dictionary work per new token and never rescans the sequence.

Keys pack an n-gram into one int (`ngram_key`) rather than a tuple: an index holds about
(max_n - min_n + 1) entries per token of a possibly long prompt, and one int is several times smaller
than a tuple of ints. Token ids must lie in [0, 2**32); the arrays that hold the tokens reject others,
so an out-of-range id fails loudly instead of aliasing another n-gram's key.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

TOKEN_BITS = 32
# Unsigned 32-bit items: 4 bytes per stored token, and storing an id outside [0, 2**32) raises.
TOKEN_TYPECODE = "I"


def ngram_keys(tokens: Sequence[int], end: int, min_n: int, max_n: int) -> Iterator[tuple[int, int]]:
    """(n, key) for each n-gram ending at `end` (inclusive), shortest first, n from min_n up to max_n
    (fewer when the sequence starts less than max_n tokens before `end`).

    The key holds the n tokens, the one at `end` in the lowest bits, under a leading 1 bit at bit
    TOKEN_BITS * n: two keys are equal exactly when their n and their tokens are, so one dict can hold
    every n. Built by extending the (n-1)-gram's key, so all n cost O(max_n) together.
    """
    packed = 0
    for n in range(1, min(max_n, end + 1) + 1):
        packed |= tokens[end - n + 1] << (TOKEN_BITS * (n - 1))
        if n >= min_n:
            yield n, packed | (1 << (TOKEN_BITS * n))


def check_ngram_sizes(min_n: int, max_n: int) -> None:
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")


class NgramIndex:
    """An incrementally built index of one token sequence (a request's prompt, then its output as it grows):
    for each n-gram (n in [min_n, max_n]) the end position of its latest occurrence."""

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        check_ngram_sizes(min_n, max_n)
        self.min_n = min_n
        self.max_n = max_n
        self._tokens = array(TOKEN_TYPECODE)
        # n-gram key -> end position of its latest occurrence, for occurrences ending before the last
        # position only. The n-grams ending at the last position are the suffix that `propose` looks up;
        # indexing them only once a later token arrives is what keeps the suffix from matching itself.
        self._latest: dict[int, int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the sequence (the prompt once at admission, then each step's new output tokens)."""
        for token in tokens:
            last = len(self._tokens) - 1
            self._tokens.append(token)  # first, so that an invalid id raises before anything is indexed
            # The previous last position stops being the suffix: its n-grams become earlier occurrences.
            for _, key in ngram_keys(self._tokens, last, self.min_n, self.max_n):
                self._latest[key] = last

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the sequence's longest suffix n-gram
        (longest n first, max_n down to min_n); [] when no suffix n-gram of length >= min_n occurred before
        (the suffix itself does not count as an earlier occurrence) or k <= 0."""
        if k <= 0:
            return []
        suffix = list(ngram_keys(self._tokens, len(self._tokens) - 1, self.min_n, self.max_n))
        for _, key in reversed(suffix):  # longest first: a longer match is better evidence
            end = self._latest.get(key)
            if end is not None:
                # end <= len - 2, so at least one token follows; the slice stops at the present.
                return self._tokens[end + 1:end + 1 + k].tolist()
        return []

    def __len__(self) -> int:
        return len(self._tokens)
