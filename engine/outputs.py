"""What the engine streams back to callers, and what it reports about itself."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    token: str  # the token's text piece (may be a partial character)
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (token_id, token, logprob), best first


@dataclass
class RequestOutput:
    """One streamed update of a request: the text and tokens produced since the previous update."""

    request_id: str
    text_delta: str
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
