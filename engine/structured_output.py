"""Structured output: JSON constrained by a grammar token mask (llguidance).

A request asking for JSON carries a `CompiledGrammar` in its SamplingParams: the schema compiled
once, off the step thread (AsyncEngine.compile_grammar), and cached by its text. At admission the
engine gives the request its own `GrammarMatcher`, a copy of the compiled grammar's start state.
Each step the sampler masks the rows that have one (`apply_grammar_masks`: every token the
grammar cannot take next gets -inf, after the other logit adjustments), and `GrammarTokenStops`
(engine/stop.py, beside the other stop rules) advances the matcher with each accepted token and
finishes the request once the grammar is complete. End-of-sequence is in the mask only where the grammar accepts what came before.

Why llguidance rather than xgrammar (measured on this project's 2-core CPU, bundled tokenizer,
49k vocab, an 8-property schema with a nested object, enum, array and pattern): a schema compiles
in 0.8 ms (xgrammar 1.4 ms, 12 ms for its first), 32 masks fill in 0.2-0.5 ms per step (xgrammar
0.2 ms), it reads tokenizer.json directly (no transformers at run time), and it bounds the work a
grammar may cost (LLParserLimits), which is how one tenant's schema is kept from stalling the others.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance
import numpy as np
import torch

from loraloom.engine.field_error import RequestFieldError

# A schema's JSON text (compact) may be at most this long: OpenAI's own limits (100 properties,
# 5 levels) fit well within it.
MAX_SCHEMA_BYTES = 32 * 1024
# Compiled grammars kept, keyed by schema text: clients send the same few schemas over and over.
CACHE_SIZE = 128
# Work bounds (llguidance's units; its defaults are 5-10x larger). Compiling is bounded by the lexer
# fuel (about 50k per ms) and the grammar size; each step's mask by the step fuel (about 14k per ms)
# and Earley items (about 20k per ms), so one matcher costs at most a few ms per step.
LIMITS = dict(max_grammar_size=100_000, initial_lexer_fuel=500_000, step_lexer_fuel=50_000,
              step_max_items=20_000, max_lexer_states=50_000, verbose_errors=False)
# JSON as models write it, and nothing more: no free whitespace, which lets a small model wander
# in newlines until max_tokens, and which would keep the grammar open after the closing brace.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# `{"type": "json_object"}`: any JSON object.
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


class CompiledGrammar:
    """A schema compiled for one engine's tokenizer: immutable, shared by every request that sends it."""

    __slots__ = ("schema_text", "_start")

    def __init__(self, schema_text: str, start: llguidance.LLMatcher) -> None:
        self.schema_text = schema_text
        self._start = start  # never advanced: each request advances its own copy

    def matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(self._start.deep_copy())


class GrammarMatcher:
    """One request's position in its grammar."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def accept(self, token_id: int) -> None:
        # A token outside the mask (only an ignore_eos end-of-sequence can be one) puts the matcher
        # in its error state, which `finished` reports.
        self._matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (proposals verified ahead of the output processor)."""
        self._matcher.rollback(num_tokens)

    def fill_mask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 words; bit t % 32 of word t // 32 is token t)."""
        _fill(self._matcher, bitmask, row)

    @property
    def finished(self) -> bool:
        """Nothing but end-of-sequence can follow (the JSON is complete), or the matcher failed."""
        return self._matcher.is_stopped()


class GrammarCompiler:
    """Compiles JSON schemas for one engine's tokenizer; thread-safe, so compiles run off the step thread."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        # Built once per engine (about 0.2 s for a 49k vocabulary): llguidance's view of the tokens.
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        self.eos_token_ids = tuple(eos_token_ids)
        self._limits = llguidance.LLParserLimits(**LIMITS)
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, schema: dict[str, Any] | str | None) -> CompiledGrammar:
        """The grammar of `schema`: a JSON schema (None: any JSON object), or a Lark grammar's source
        (a str, as tool calls are constrained: platform/api/tools/formats.py). Raises RequestFieldError naming
        the request field the grammar came from (response_format or tools)."""
        if isinstance(schema, str):
            field, key = "tools", "lark:" + schema
        else:
            field, key = "response_format", _schema_text(ANY_OBJECT_SCHEMA if schema is None else schema)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        try:
            if isinstance(schema, str):
                grammar = llguidance.LLMatcher.grammar_from_lark(schema)
            else:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(key, overrides=JSON_OPTIONS)
        except ValueError as error:
            raise RequestFieldError(field, f"the JSON schema is not valid: {error}") from None
        start = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self._limits)
        if not start.is_error():
            # The first mask builds the lexer's start states; done here, so a bad grammar fails here
            # and not in the step loop.
            _fill(start, np.empty((1, _mask_words(self.tokenizer.vocab_size)), dtype=np.int32), 0)
        if start.is_error():
            error = start.get_error()
            if field == "tools":  # the first line says what; the rest would quote the whole generated grammar
                error = re.sub(r"^at \d+\(\d+\): ", "", error.splitlines()[0] if error else error)
            raise RequestFieldError(field, f"the JSON schema cannot be served: {_in_our_words(error)}")
        compiled = CompiledGrammar(key, start)
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


def apply_grammar_masks(
    values: torch.Tensor,  # [rows, vocab] float32, modified in place
    rows: Sequence[int],  # the rows of `values` that have a matcher
    matchers: Sequence[GrammarMatcher],
    eos_token_ids: Sequence[int],
) -> None:
    """-inf for every token the row's grammar cannot take next; other rows are not touched."""
    vocab_size = values.shape[1]
    bitmask = np.empty((len(rows), _mask_words(vocab_size)), dtype=np.int32)
    for position, matcher in enumerate(matchers):
        matcher.fill_mask(bitmask, position)
    # A failed matcher's mask is empty; end-of-sequence then ends the request instead of a -inf row.
    empty = ~bitmask.any(axis=1)
    if empty.any():
        words = bitmask.view(np.uint32)
        for token in eos_token_ids:
            words[empty, token // 32] |= np.uint32(1 << (token % 32))
    # Bit t % 32 of word t // 32, least significant first, is token t; 1 = allowed.
    forbidden = np.unpackbits((~bitmask).view(np.uint8), axis=1, bitorder="little")[:, :vocab_size].view(bool)
    if values.device.type == "cpu":
        # In place through numpy, row by row: no gathered copies, and no torch intra-op threads, which
        # cost 10x more than the write itself on a small shared CPU (0.5 ms against 8 ms for 32 rows here).
        target = values.numpy()
        for position, row in enumerate(rows):
            np.copyto(target[row], np.float32(-np.inf), where=forbidden[position])
        return
    index = torch.tensor(list(rows), device=values.device)
    values[index] = values[index].masked_fill_(torch.from_numpy(forbidden).to(values.device), float("-inf"))


# llguidance's terse codes for grammars it builds but cannot run, in words a client can act on.
_ENGINE_ERRORS = {
    "NoExtensionBias": "its $ref definitions refer to one another in a cycle that never describes a value; give "
                       "each recursive definition an object or array around its reference, or drop the cycle",
}
_NON_VERBOSE_MARK = "<non-verbose/>"  # llguidance appends it when verbose_errors is off (LIMITS)


def _in_our_words(engine_error: str) -> str:
    """The grammar engine's refusal of a compiled schema, as a message naming the fault and the fix."""
    text = engine_error.replace(_NON_VERBOSE_MARK, "").strip()
    for code, words in _ENGINE_ERRORS.items():
        if code in text:
            return words
    return f"the grammar built from it is refused ({text}); simplify the schema (fewer alternatives, no $ref cycles)"


def _fill(matcher: llguidance.LLMatcher, bitmask: np.ndarray, row: int) -> None:
    target = bitmask[row]
    matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)


def _mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def _schema_text(schema: dict[str, Any]) -> str:
    """The schema's compact JSON text: the cache key, and what is compiled. Keys keep their order,
    which is the order the properties are generated in."""
    if not isinstance(schema, dict):
        raise RequestFieldError("response_format", "json_schema.schema must be a JSON object")
    try:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError) as error:
        raise RequestFieldError("response_format", f"json_schema.schema cannot be serialized: {error}") from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise RequestFieldError("response_format", f"json_schema.schema is {len(text.encode())} bytes of JSON; "
                                f"at most {MAX_SCHEMA_BYTES} are accepted")
    return text
