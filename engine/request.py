"""A request's sampling parameters and its state inside the engine.

The scheduler, block manager and runner share the `Request` object; each
reads the fields it needs and only the owner named in the comment writes them.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag

if TYPE_CHECKING:  # llguidance is imported by the requests that use it, not by the scheduler
    from loraloom.engine.structured_output import CompiledGrammar, GrammarMatcher

# The ranges the sampler serves these fields in (OpenAI's). The API checks a request against them
# (platform/api/schemas/generation.py builds its bounds and their descriptions from these); the engine
# checks only what needs the model (LLMEngine.validate_request), so nothing is checked twice.
MAX_TEMPERATURE = 2.0
MAX_TOP_LOGPROBS = 20
MAX_PENALTY = 2.0  # |presence_penalty| and |frequency_penalty|, OpenAI's range
MAX_LOGIT_BIAS = 100.0  # |bias| per token, OpenAI's range
MAX_LOGIT_BIAS_TOKENS = 300  # entries per request, OpenAI's limit
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
    # Logit adjustments (engine/logit_adjustments.py); the defaults leave the logits alone.
    presence_penalty: float = 0.0  # OpenAI: subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # OpenAI: subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # vLLM/HF: divides (or, if negative, multiplies) logits of prompt and output tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # vLLM: the stopping tokens are masked until this many tokens were generated
    # Structured output (engine/structured_output.py): only tokens this grammar allows are sampled.
    grammar: CompiledGrammar | None = None

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampler must change this request's logits before choosing (most requests: no)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.grammar is not None)

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
    # Who asked (engine/tenancy.py): its id scopes the prefix cache and names its fair-share account,
    # its name labels the metrics, its weight is its fair share.
    tenant: TenantTag = DEFAULT_TENANT
    # Optional isolation within the tenant (the API's cache_salt / prompt_cache_key): requests with
    # different salts never share KV blocks (None and "" are the same: no salt).
    cache_salt: str | None = None
    # Monotonic arrival order: lower = older = higher priority (never reset on preemption).
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))

    # Written by the engine at admission when the request has a grammar; advanced by its TokenStops.
    grammar: GrammarMatcher | None = None
    # Written by the engine after sampling.
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Written by the scheduler / block manager.
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # tokens served from the prefix cache at first schedule
    block_ids: list[int] = field(default_factory=list)
    block_row: int = -1  # its row in the block manager's BlockRows mirror of block_ids (-1: none)
    # Prefix-cache digests of its leading full blocks of all_token_ids (with cache_scope), extended as
    # the block manager needs them: tokens are only ever appended, so a digest never goes stale.
    block_hashes: list[bytes] = field(default_factory=list)
    adapter_slot: int = -1  # the GPU slot of its adapter while running (-1: the base model)
    # Written by the engine's speculator after each step the request sampled in: tokens proposed to follow
    # its last token, verified in its next decode step if the scheduler has room for them ([]: none).
    draft_token_ids: list[int] = field(default_factory=list)
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
    def metrics_labels(self) -> tuple[str, str]:
        """(tenant, adapter name) reported in metrics and stats ("base" for no adapter): two tenants'
        adapters of the same name are counted apart."""
        return self.tenant.name, BASE_ADAPTER_LABEL if self.adapter is None else self.adapter.name

    @property
    def cache_scope(self) -> str:
        """What is mixed into every prefix-cache block hash besides the tokens: the tenant's id, the adapter's
        key and the request's cache salt. KV is never shared across tenants (the base model included), nor
        across adapters, nor across salts. repr() of the tuple keeps the parts apart: no choice of salt can
        make one scope's string equal another's."""
        return repr((self.tenant.id, self.adapter_key, self.cache_salt or ""))
