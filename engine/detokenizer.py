"""Incremental detokenization: turn a stream of token ids into a stream of finished text.

A token is not a unit of text: byte-level BPE pieces and byte-fallback tokens
(<0xE2>) can end inside a multi-byte character, and SentencePiece decoders
change a piece's leading space depending on what precedes it. So each step
decodes a small window of recent tokens twice (with and without the new
token) and emits the difference, holding it back while it ends in a broken
character. The window restarts after every emission, so a step costs
O(window), not O(sequence).
"""
from __future__ import annotations

import threading
from typing import Protocol

# Tokens of the prompt decoded before the first output token, so the decoder
# sees the context that decides the first piece's leading space.
PROMPT_CONTEXT_TOKENS = 5

# What a decoder puts where the bytes so far end in the middle of a UTF-8 character.
_REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    """The part of a tokenizer the detokenizer needs; `tokenizers.Tokenizer` and engine.tokenizer both fit."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Feed output tokens one at a time with `step`; call `flush` once generation ends.

    The concatenation of every `step` and the final `flush` equals the decode of the
    output tokens in the context of the prompt. A text that truly ends in U+FFFD is
    only released by `flush`.
    """

    def __init__(self, tokenizer: Decoder, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # The window starts where the last emission began; its first `_num_context` tokens
        # are already emitted and only serve as decoding context (vLLM's prefix/read offsets).
        self._window = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._num_context = len(self._window)

    def step(self, new_token_id: int) -> str:
        """Text finalized by this token; "" while it ends inside a character (or adds no text)."""
        self._window.append(new_token_id)
        return self._advance(allow_broken_tail=False)

    def flush(self) -> str:
        """Whatever is still held back, broken tail included; call once after the last token."""
        return self._advance(allow_broken_tail=True)

    def _advance(self, allow_broken_tail: bool) -> str:
        context_text = self._decode(self._window[: self._num_context])
        window_text = self._decode(self._window)
        if len(window_text) <= len(context_text):
            return ""
        if window_text.endswith(_REPLACEMENT_CHAR) and not allow_broken_tail:
            return ""
        self._window = self._window[self._num_context :]
        self._num_context = len(self._window)
        return window_text[len(context_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)


class DeferredDetokenizer:
    """An IncrementalDetokenizer run only when someone reads a request's text.

    The engine gives it, as the DeferredText of outputs.py, to every output of a request
    without stop strings: the step loop then does no text work for it (vLLM v1 likewise
    detokenizes outside its engine loop). It reads the tokens from the request's own
    output list, so the step hands it nothing. The first read of output `index`'s text
    detokenizes every earlier token not yet done, in order, and keeps each delta, so a
    delta is exactly what eager detokenization would have given, whatever the read
    order. Reads may happen on another thread (AsyncEngine's event loop) than the step
    that appends tokens: appending to a list is atomic, resolving holds a lock.

    The outputs refer to it and it refers to no output, so no reference cycle is made.
    """

    def __init__(self, detokenizer: IncrementalDetokenizer, output_token_ids: list[int]) -> None:
        self._detokenizer = detokenizer
        self._token_ids = output_token_ids  # the request's list; only ever appended to
        self._deltas: list[str] = []  # the delta of each token detokenized so far
        self._lock = threading.Lock()

    def text(self, index: int, final: bool) -> str:
        with self._lock:
            while len(self._deltas) <= index:
                position = len(self._deltas)
                delta = self._detokenizer.step(self._token_ids[position])
                if final and position == index:
                    delta += self._detokenizer.flush()
                self._deltas.append(delta)
            return self._deltas[index]
