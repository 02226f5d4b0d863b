"""What the engine streams back to callers, and what it reports about itself."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class TokenLogprob:
    token_id: int
    token: str  # the token's text piece (may be a partial character)
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (token_id, token, logprob), best first


class DeferredText(Protocol):
    """Produces an output's text on first read: `resolve` must assign `output.text_delta` a str."""

    def resolve(self, output: "RequestOutput") -> None: ...


class _TextDeltaField:
    """The storage of RequestOutput.text_delta: a str, or a DeferredText turned into one on first read.

    The engine defers detokenization of requests without stop strings (it does not need their
    text), so the step loop never decodes text that nobody reads; whoever reads it pays, once.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    def __get__(self, output: "RequestOutput | None", owner: type) -> str:
        if output is None:
            # Class access: no default value, so the dataclass keeps text_delta a required field.
            raise AttributeError(self._slot[1:])
        value = output.__dict__[self._slot]
        if not isinstance(value, str):
            value.resolve(output)
            value = output.__dict__[self._slot]
        return value

    def __set__(self, output: "RequestOutput", value: "str | DeferredText") -> None:
        output.__dict__[self._slot] = value


def unresolved_text(output: "RequestOutput") -> "DeferredText | None":
    """The DeferredText that will produce `output`'s text, or None once it is a str (reading nothing)."""
    value = output.__dict__["_text_delta"]
    return None if isinstance(value, str) else value


@dataclass
class RequestOutput:
    """One streamed update of a request: the text and tokens produced since the previous update."""

    request_id: str
    text_delta: str = _TextDeltaField()  # type: ignore[assignment]  # str, possibly computed on first read
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None  # one per token in token_ids, when requested
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort", once finished
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_cached: int
    adapter_slots_used: int
    adapter_slots_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    running_per_adapter: dict[str, int]  # adapter name ("base" for none) -> running requests
    waiting_per_adapter: dict[str, int]
    requests_per_adapter_total: dict[str, int]
