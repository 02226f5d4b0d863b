"""A request's sampling parameters and its state inside the engine.

The scheduler, block manager and runner share the `Request` object; each
reads the fields it needs and only the owner named in the comment writes them.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from loraloom.engine.adapters import AdapterHandle

# Bounds that the API also reports in its 400 messages.
MAX_TEMPERATURE = 2.0
MAX_TOP_LOGPROBS = 20
BASE_ADAPTER_LABEL = "base"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = disabled
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # None: no logprobs. 0: the sampled token's logprob only. k>0: also the top k.
    logprobs: int | None = None

    def validate(self) -> None:
        """Raise ValueError whose message starts with the offending field name."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature: must be between 0 and {MAX_TEMPERATURE}, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k: must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs: must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


_arrival_counter = itertools.count()


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # None = the base model. The handle carries the runtime adapter key.
    adapter: AdapterHandle | None = None
    # Monotonic arrival order: lower = older = higher priority (never reset on preemption).
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))

    # Written by the engine after sampling.
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Written by the scheduler / block manager.
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # tokens served from the prefix cache at first schedule
    block_ids: list[int] = field(default_factory=list)
    block_row: int = -1  # its row in the block manager's BlockRows mirror of block_ids (-1: none)
    adapter_slot: int = -1  # the GPU slot of its adapter while running (-1: the base model)
    num_preemptions: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list (a decode step reads one token)."""
        prompt_len = len(self.prompt_token_ids)
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len:end - prompt_len]
        return self.all_token_ids[start:end]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def adapter_key(self) -> str | None:
        return None if self.adapter is None else self.adapter.key

    @property
    def adapter_label(self) -> str:
        """The adapter name reported in metrics and stats ("base" for none)."""
        return BASE_ADAPTER_LABEL if self.adapter is None else self.adapter.name

    @property
    def cache_salt(self) -> str:
        """Identity mixed into every prefix-cache block hash: KV is never shared across adapters."""
        return "base" if self.adapter is None else f"adapter:{self.adapter.key}"
