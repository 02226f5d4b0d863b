"""What the engine streams back to callers, and what it reports about itself."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from loraloom.engine.request_latency import LabelledHistograms


@dataclass
class TokenLogprob:
    token_id: int
    token: str  # the token's text piece (may be a partial character)
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (token_id, token, logprob), best first


class DeferredText(Protocol):
    """Produces the text of a request's outputs on first read (engine/detokenizer.py DeferredDetokenizer)."""

    def text(self, index: int, final: bool) -> str:
        """The text delta of the request's output token `index` (0-based), the held-back tail included if `final`."""
        ...


@dataclass(slots=True)  # the step builds one per running request per step: slots make that cheap
class RequestOutput:
    """One streamed update of a request: the text and tokens produced since the previous update.

    Its text is either given (`text`) or made on first read of `text_delta` by `deferred`: the
    engine defers detokenization of requests without stop strings (it does not need their text),
    so the step loop never decodes text that nobody reads; whoever reads it pays, once.
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None  # one per token in token_ids, when requested
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error", once finished
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    text: str | None = None  # None: `deferred` makes it when text_delta is first read
    deferred: DeferredText | None = None
    error: str | None = None  # set with finish_reason "error": why the request failed (it alone)

    @property
    def text_delta(self) -> str:
        if self.text is None:
            # Its one token is the request's output token number num_output_tokens - 1 (0-based).
            self.text = self.deferred.text(self.num_output_tokens - 1, self.finished)
        return self.text


class RequestFailedError(RuntimeError):
    """One request failed in a step that went on for the others (AsyncEngine raises it in that
    request's stream; LLMEngine.step reports it as an output with finish_reason "error")."""


# The LoRA info metric's waiting list names at most this many adapters, the oldest requests' first (those
# load next): a queue of thousands of distinct adapters would otherwise make one huge label value.
MAX_LISTED_WAITING_ADAPTERS = 64


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
    # (tenant, adapter name) -> requests; "base" names no adapter (Request.metrics_labels). The running
    # and waiting counts name only requests in flight, so the queue bounds them.
    running_per_adapter: dict[tuple[str, str], int]
    waiting_per_adapter: dict[tuple[str, str], int]
    # (tenant, model) -> requests received since start; the pairs past the operator's adapter cap
    # count under model "other" (engine/metric_labels.py), as every labelled total below.
    requests_per_adapter_total: dict[tuple[str, str], int]
    block_size: int = 0  # tokens per KV block
    # The adapters (AdapterHandle.name, as requests name them; the base model left out) of the running
    # and of the waiting requests, each once, oldest request first: vLLM's LoRA info labels.
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)  # at most MAX_LISTED_WAITING_ADAPTERS
    # Adapter residency: the host cache (validated weights in CPU memory) and GPU slot traffic.
    host_cache_adapters: int = 0
    host_cache_bytes: int = 0
    host_cache_capacity: int = 0  # entries
    host_cache_hits_total: int = 0
    host_cache_misses_total: int = 0  # lookups that fetched from storage
    host_cache_evictions_total: int = 0
    adapter_slot_loads_total: int = 0  # copies of an adapter into a GPU slot
    adapter_slot_evictions_total: int = 0  # loads that replaced another adapter
    # Per tenant name (TenantTag.name; engine/fair_share.py): requests queued and running now, tokens served
    # (prompt tokens at first admission + output tokens) since start, and the fair-share counter (virtual
    # tokens: served / weight, plus lifts). Summed over replicas, as everything here: each replica keeps
    # its own counter, so the sum is the tenant's weighted service across the set.
    queued_per_tenant: dict[str, int] = field(default_factory=dict)
    running_per_tenant: dict[str, int] = field(default_factory=dict)
    served_tokens_per_tenant: dict[str, int] = field(default_factory=dict)
    share_counter_per_tenant: dict[str, float] = field(default_factory=dict)
    # (tenant, model, finish reason: stop, length, abort or error) -> requests that ended so.
    finished_requests_total: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # Speculative decoding (engine/speculation/), per (tenant, model) as the finished requests: drafts verified,
    # the tokens they proposed, the proposals accepted, and the tokens those steps emitted (accepted + one each).
    spec_decode_drafts_total: dict[tuple[str, str], int] = field(default_factory=dict)
    spec_decode_draft_tokens_total: dict[tuple[str, str], int] = field(default_factory=dict)
    spec_decode_accepted_tokens_total: dict[tuple[str, str], int] = field(default_factory=dict)
    spec_decode_emitted_tokens_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # The recent answers drafts are proposed from (engine/speculation/output_store.py): tokens and bytes held.
    spec_decode_store_tokens: int = 0
    spec_decode_store_bytes: int = 0
    # Per-request latencies since start, per (tenant, model) (engine/request_latency.py).
    time_to_first_token: LabelledHistograms = field(default_factory=dict)
    inter_token_latency: LabelledHistograms = field(default_factory=dict)
    e2e_request_latency: LabelledHistograms = field(default_factory=dict)

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV blocks requests hold (0..1); free blocks kept for prefix reuse count as free."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclass(frozen=True)
class AdapterResidency:
    """Where an engine holds adapters now, by runtime key: in a GPU slot (and the host cache), or in
    the host cache only. The host cache's lookup counts are in EngineStats."""

    slots: dict[str, int]  # runtime key -> GPU slot index
    host_cache_keys: frozenset[str]

    @property
    def resident_keys(self) -> frozenset[str]:
        return self.host_cache_keys | self.slots.keys()


class EngineUnavailableError(RuntimeError):
    """No engine can take or finish the request now (the replica serving it died, or none is up yet).
    Nothing about the request was wrong: the client should send it again after `retry_after_s`.
    Raised by remote EngineClients (platform/ray_serve); the API answers 503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

