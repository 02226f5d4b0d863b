"""Recent finished outputs per (tenant, adapter), proposed as continuations of templated answers.

An adapter fine-tuned for extraction or classification answers many requests with near-identical text
(the same JSON keys, the same closing tokens), which the request's own tokens cannot predict the first
time. This store keeps each scope's recent outputs, led by the end of their prompts, and proposes what
followed the latest stored occurrence of a request's last n-gram.

Scopes never mix: a proposal is accepted only when the model would have produced it, so a proposal drawn
from another tenant's output would leak that text through the accepted-token counts. Every lookup and
every eviction works inside one scope's own structures.

Memory is bounded by stored tokens, per scope and in all; each sequence's index entries are removed when
the sequence is evicted (only those still pointing at it: a later sequence may have taken the key over),
so the index never holds more than (number of n sizes) entries per live token. A sequence longer than
the per-scope bound is not stored at all: keeping its tail would evict every other answer of the scope
for one outlier, and the tail without its prompt lead cannot match at the start of an answer anyway.

Threading: the engine's step thread makes every call except `stats()`, which a metrics scrape may make
from another thread; one lock serializes them all (uncontended on the step thread, so it costs little).
"""
from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from loraloom.engine.speculation.ngram_index import TOKEN_TYPECODE, check_ngram_sizes, ngram_keys

Scope = tuple[str, str | None]  # (tenant id, adapter runtime key or None for the base model)

# The memory estimate's cost of one index entry on 64-bit CPython: its share of the dict's slot table
# (hash, key and value pointers, at the dict's fill ratio) plus the packed key int (up to 4 x 32 bits)
# and the packed value int (sequence id and position). An estimate for sizing, not an exact count.
INDEX_ENTRY_BYTES = 128
_POSITION_BITS = 32


@dataclass(frozen=True)
class OutputStoreStats:
    scopes: int
    sequences: int
    tokens: int
    # An estimate of the memory held: index_entries * INDEX_ENTRY_BYTES + stored tokens * 4 (each sequence
    # is an array of unsigned 32-bit ids). Container overheads per scope and per sequence are left out.
    bytes: int
    index_entries: int


class _ScopeOutputs:
    """One scope's stored sequences (oldest first) and their n-gram index."""

    def __init__(self) -> None:
        self.sequences: OrderedDict[int, array] = OrderedDict()  # sequence id -> its tokens
        self.tokens = 0
        # n-gram key -> (sequence id << _POSITION_BITS) | end position of its latest stored occurrence.
        self.index: dict[int, int] = {}


class OutputStore:
    def __init__(self, max_tokens: int = 65_536, max_tokens_per_scope: int = 8_192,
                 min_n: int = 2, max_n: int = 4, lead_tokens: int = 4) -> None:
        check_ngram_sizes(min_n, max_n)
        if max_tokens < 1 or max_tokens_per_scope < 1 or lead_tokens < 0:
            raise ValueError("need max_tokens >= 1, max_tokens_per_scope >= 1 and lead_tokens >= 0")
        self.max_tokens = max_tokens
        # A scope can never hold more than the whole store, so the total bound caps the scope's as well.
        self.max_tokens_per_scope = min(max_tokens_per_scope, max_tokens)
        self.min_n = min_n
        self.max_n = max_n
        self.lead_tokens = lead_tokens
        self._lock = threading.Lock()
        self._scopes: OrderedDict[Scope, _ScopeOutputs] = OrderedDict()  # least recently used first
        self._next_id = 0
        self._sequences = 0
        self._tokens = 0

    def record(self, scope: Scope, prompt_tail: Sequence[int], output: Sequence[int]) -> None:
        """Keep a finished request's output, led by the last `lead_tokens` tokens of its prompt (so that a new
        request whose prompt ends the same way, e.g. a chat template's assistant header, matches before it
        has generated anything). Evicts the scope's oldest sequences past max_tokens_per_scope, and the least
        recently used scopes (recorded into or proposed from) past max_tokens in all.

        Not stored: an empty output (nothing to propose), a sequence too short to hold an n-gram with a token
        after it, and a sequence longer than max_tokens_per_scope (see the module's docstring)."""
        lead_start = len(prompt_tail) - min(self.lead_tokens, len(prompt_tail))
        length = len(prompt_tail) - lead_start + len(output)
        if len(output) == 0 or length <= self.min_n or length > self.max_tokens_per_scope:
            return  # checked before copying, so a long skipped answer costs nothing
        tokens = array(TOKEN_TYPECODE, (prompt_tail[i] for i in range(lead_start, len(prompt_tail))))
        tokens.extend(array(TOKEN_TYPECODE, output))
        with self._lock:
            outputs = self._scopes.get(scope)
            if outputs is None:
                outputs = self._scopes[scope] = _ScopeOutputs()
            self._scopes.move_to_end(scope)
            sequence_id = self._next_id
            self._next_id += 1
            outputs.sequences[sequence_id] = tokens
            outputs.tokens += len(tokens)
            self._sequences += 1
            self._tokens += len(tokens)
            # The last position is not indexed: nothing follows it. Later positions overwrite earlier ones,
            # and this sequence overwrites older ones, so each key keeps its latest occurrence.
            for end in range(len(tokens) - 1):
                for _, key in ngram_keys(tokens, end, self.min_n, self.max_n):
                    outputs.index[key] = (sequence_id << _POSITION_BITS) | end
            while outputs.tokens > self.max_tokens_per_scope:
                self._evict_oldest(scope, outputs)
            while self._tokens > self.max_tokens:
                # The scope just recorded into is the most recently used, and it alone fits the total bound,
                # so the least recently used scope here is always another one.
                lru_scope, lru_outputs = next(iter(self._scopes.items()))
                self._evict_oldest(lru_scope, lru_outputs)

    def propose(self, scope: Scope, recent: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest stored occurrence (in this scope only) of the longest suffix
        n-gram of `recent` (the request's tokens so far, prompt then output; only its last max_n tokens are read),
        and the matched n (0 with [] when none). Marks the scope recently used."""
        tail = array(TOKEN_TYPECODE, (recent[i] for i in range(max(0, len(recent) - self.max_n), len(recent))))
        with self._lock:
            outputs = self._scopes.get(scope)
            if outputs is None:
                return [], 0
            self._scopes.move_to_end(scope)
            if k <= 0:
                return [], 0
            suffix = list(ngram_keys(tail, len(tail) - 1, self.min_n, self.max_n))
            for n, key in reversed(suffix):  # longest first
                entry = outputs.index.get(key)
                if entry is not None:
                    tokens = outputs.sequences[entry >> _POSITION_BITS]
                    end = entry & ((1 << _POSITION_BITS) - 1)
                    # Runs on to the end of the stored sequence (a template's closing tokens), at most k.
                    return tokens[end + 1:end + 1 + k].tolist(), n
            return [], 0

    def stats(self) -> OutputStoreStats:
        with self._lock:
            entries = sum(len(outputs.index) for outputs in self._scopes.values())
            token_bytes = self._tokens * array(TOKEN_TYPECODE).itemsize
            return OutputStoreStats(scopes=len(self._scopes), sequences=self._sequences, tokens=self._tokens,
                                    bytes=entries * INDEX_ENTRY_BYTES + token_bytes, index_entries=entries)

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()
            self._sequences = 0
            self._tokens = 0

    def _evict_oldest(self, scope: Scope, outputs: _ScopeOutputs) -> None:
        """Drop the scope's oldest sequence and the index entries still pointing at it (the lock is held).
        Costs what recording the sequence cost, so eviction adds a constant factor to `record`."""
        sequence_id, tokens = outputs.sequences.popitem(last=False)
        for end in range(len(tokens) - 1):
            for _, key in ngram_keys(tokens, end, self.min_n, self.max_n):
                entry = outputs.index.get(key)
                if entry is not None and entry >> _POSITION_BITS == sequence_id:
                    del outputs.index[key]
        outputs.tokens -= len(tokens)
        self._sequences -= 1
        self._tokens -= len(tokens)
        if not outputs.sequences:
            del self._scopes[scope]
