"""LLMEngine: the synchronous core. `add_request`, then `step()` until done.

One step = schedule -> copy newly admitted adapters into their slots -> run the
model -> sample -> advance the scheduler -> check stops and emit outputs. The
engine is single-threaded; AsyncEngine serializes all calls onto one thread.

Text is produced where it is needed: a request with stop strings is detokenized
in the step (its stop check reads the text); any other request's outputs carry
a DeferredDetokenizer and are detokenized when their text_delta is first read,
off the step loop (by AsyncEngine's consumers).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from loraloom.engine.lora.host_cache import AdapterFetcher, HostAdapterCache, fetch_local_dir
from loraloom.engine.lora.slots import AdapterSlotTable
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.files import runtime_key_scope
from loraloom.engine.config import EngineConfig
from loraloom.engine.detokenizer import DeferredDetokenizer, IncrementalDetokenizer
from loraloom.engine.field_error import RequestFieldError
from loraloom.engine.model.fp8 import quantize_model_fp8
from loraloom.engine.kv_cache import BlockManager
from loraloom.engine.model.kv_scales import prepare_kv_scales
from loraloom.engine.model.loader import load_model
from loraloom.engine.lora.layers import LoRASlotPool, attach_lora
from loraloom.engine.memory import plan_memory
from loraloom.engine.model.llama import LlamaModel
from loraloom.engine.model_runner import ModelRunner, StepTimings
from loraloom.engine.outputs import (MAX_LISTED_WAITING_ADAPTERS, EngineStats,
                                     RequestOutput, TokenLogprob)
from loraloom.engine.request import BASE_ADAPTER_LABEL, Request, RequestStatus, SamplingParams
from loraloom.engine.metric_labels import MetricLabels
from loraloom.engine.request_latency import LatencyHistogram, LatencySeries, RequestLatencies
from loraloom.engine.sampler import make_generator
from loraloom.engine.scheduler import Scheduler
from loraloom.engine.stop import StopStringMatcher, TokenStops
from loraloom.engine.structured_output import CompiledGrammar, GrammarCompiler, GrammarTokenStops
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag
from loraloom.engine.tokenizer import Tokenizer
from loraloom.kernels.backend import get_backend

logger = logging.getLogger(__name__)

HOST_ADAPTER_CACHE_SIZE = 64


@dataclass(slots=True)
class _Tracked:
    """Per-request state the scheduler does not need: text and stops.

    Without a tokenizer all three text fields are None and outputs carry token ids only.
    """

    request: Request
    token_stops: TokenStops
    stops: StopStringMatcher | None  # None: no stop strings
    detokenizer: IncrementalDetokenizer | None  # text made in the step: requests with stop strings
    deferred: DeferredDetokenizer | None  # text made when read: requests without stop strings
    arrival_time: float  # time.monotonic() when the request reached the engine (AsyncEngine.generate)
    labels: tuple[str, str]  # (tenant, model) its metrics count under, past the adapter cap folded (metric_labels.py)
    latency: LatencySeries  # the histograms of `labels`
    last_token_time: float | None = None  # when its latest token was sampled; None before the first


class LLMEngine:
    def __init__(self, model_dir: Path, config: EngineConfig, adapter_fetch: AdapterFetcher = fetch_local_dir) -> None:
        """Serve the Hugging Face checkpoint in `model_dir` (config.json, safetensors weights, tokenizer)."""
        device = torch.device(config.device)
        model = load_model(model_dir, getattr(torch, config.dtype), device, get_backend(device),
                           quantize_to_fp8=config.quantization == "fp8",
                           fp8_activation_terms=config.fp8_activation_terms)
        self._setup(model, config, Tokenizer.from_dir(model_dir), adapter_fetch, Path(model_dir))

    @classmethod
    def from_model(
        cls,
        model: LlamaModel,
        config: EngineConfig,
        tokenizer: Tokenizer | None = None,
        adapter_fetch: AdapterFetcher = fetch_local_dir,
    ) -> "LLMEngine":
        """Serve an already-built, unquantized model, e.g. engine/model/random_model.py's random weights made on the device.

        `config.quantization` applies as it does to a checkpoint: "fp8" quantizes the model's projections here.
        Without a tokenizer the engine works on token ids alone: outputs carry no text, and
        requests asking for stop strings or logprobs are refused.
        """
        embedding = model.embed_tokens.weight
        if embedding.device.type != torch.device(config.device).type or embedding.dtype != getattr(torch, config.dtype):
            raise ValueError(
                f"model: its weights are {embedding.dtype} on {embedding.device}, but the EngineConfig asks for "
                f"dtype={config.dtype!r} on device={config.device!r}; build the model in the config's dtype and device"
            )
        if config.quantization == "fp8":
            quantize_model_fp8(model, two_term_activations=config.fp8_activation_terms == 2)
        engine = cls.__new__(cls)  # __init__ is the checkpoint path; both paths end in _setup
        engine._setup(model, config, tokenizer, adapter_fetch, model_dir=None)
        return engine

    def _setup(
        self,
        model: LlamaModel,
        config: EngineConfig,
        tokenizer: Tokenizer | None,
        adapter_fetch: AdapterFetcher,
        model_dir: Path | None,
    ) -> None:
        self.model_dir = model_dir
        self.model_config = model.config
        self.tokenizer = tokenizer
        self.eos_token_ids = self.model_config.eos_token_ids if tokenizer is None else tokenizer.eos_token_ids
        device = torch.device(config.device)
        kernels = get_backend(device)
        lora_pool = LoRASlotPool(
            model_config=self.model_config,
            num_slots=config.max_loras,
            max_rank=config.max_lora_rank,
            dtype=getattr(torch, config.resolved_lora_dtype),
            device=device,
            backend=kernels,
            narrow_exact_adapters=config.lora_dtype == "auto",
        )
        attach_lora(model, lora_pool)
        # Before the memory plan, whose profiling step would otherwise be the first to use the scales,
        # and before decode graphs are captured (they read the scales by address).
        self.kv_scales_source = prepare_kv_scales(model, config, tokenizer)
        # Sized after the weights and LoRA slots are resident: on CUDA the plan measures what is left.
        self.memory_plan = plan_memory(model, self.model_config, config, lora_pool)
        config = dataclasses.replace(config, num_kv_blocks=self.memory_plan.num_kv_blocks)
        self.config = config
        self.max_model_len = config.resolved_max_model_len(self.model_config)
        self.runner = ModelRunner(model=model, model_config=self.model_config, config=config, lora_pool=lora_pool,
                                  eos_token_ids=tuple(self.eos_token_ids))
        if device.type == "cuda" and not config.enforce_eager:
            self.runner.enable_decode_graphs(self.max_model_len, capture=True)
        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.slot_table = AdapterSlotTable(config.max_loras)
        self.scheduler = Scheduler(config, self.block_manager, self.slot_table)
        self.adapter_cache = HostAdapterCache(
            capacity=HOST_ADAPTER_CACHE_SIZE,
            model_config=self.model_config,
            max_rank=config.max_lora_rank,
            fetch=adapter_fetch,
        )
        self._tracked: dict[str, _Tracked] = {}
        self._grammar_compiler: GrammarCompiler | None = None  # built on first use (about 0.2 s)
        self._grammar_compiler_lock = threading.Lock()
        # Seeded requests' own random streams; the runner reads None for every other request.
        self._generators: dict[str, torch.Generator] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.latencies = RequestLatencies()
        self.last_step_timings = StepTimings()
        self.metric_labels = MetricLabels(config.metrics_max_adapters)
        self.requests_per_adapter: Counter[tuple[str, str]] = Counter()  # (tenant, model) labels
        self.finished_requests: Counter[tuple[str, str, str]] = Counter()  # (tenant, model, finish reason)

    # ----------------------------------------------------------------- requests
    def load_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch, verify and validate an adapter into the host cache (raises AdapterLoadError)."""
        self.adapter_cache.get(adapter)

    def hold_adapter(self, adapter: AdapterHandle) -> None:
        """`load_adapter`, and hold the host-cache entry for a request that `admit_request(...,
        adapter_held=True)` will admit (the request's end releases it); or `release_adapter` if it never is."""
        self.adapter_cache.acquire(adapter)

    def release_adapter(self, key: str) -> None:
        self.adapter_cache.release(key)

    def unload_adapter(self, key: str) -> None:
        """Drop an adapter's weights from the host cache. Requests already holding its GPU slot finish on it."""
        self.adapter_cache.discard(key)

    def compile_grammar(self, schema: dict | str | None) -> CompiledGrammar:
        """Compile a JSON schema (None: any JSON object), or a Lark grammar given as its source text, for this
        engine's tokenizer; cached by its text.
        Thread-safe, and slow for a big schema: AsyncEngine runs it off the step thread.
        Raises RequestFieldError naming response_format (tools for a Lark grammar)."""
        if self.tokenizer is None:
            raise RequestFieldError("response_format", "structured output needs a tokenizer and this engine has none")
        with self._grammar_compiler_lock:
            if self._grammar_compiler is None:
                self._grammar_compiler = GrammarCompiler(self.tokenizer.to_json(), self.model_config.vocab_size,
                                                         self.eos_token_ids)
        return self._grammar_compiler.compile(schema)

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestFieldError for what this engine cannot serve: what needs the model (its tokenizer,
        vocabulary, context length). The fields' ranges are the API's to check, from the
        bounds in engine/request.py (platform/api/schemas/generation.py); each check is made once."""
        if self.tokenizer is None and params.stop:
            raise RequestFieldError("stop", "stop strings need a tokenizer and this engine has none; use stop_token_ids")
        if params.grammar is not None and not isinstance(params.grammar, CompiledGrammar):
            raise RequestFieldError("response_format", "the grammar must be a CompiledGrammar, made by compile_grammar")
        if self.tokenizer is None and params.logprobs is not None:
            raise RequestFieldError("logprobs", "token texts need a tokenizer and this engine has none; leave logprobs "
                                    "unset")
        if not prompt_token_ids:
            raise RequestFieldError("prompt", "must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(not 0 <= token < vocab for token in prompt_token_ids):
            raise RequestFieldError("prompt", f"token ids must be in [0, {vocab})")
        outside = [token for token in params.logit_bias if not 0 <= token < vocab]
        if outside:
            raise RequestFieldError("logit_bias", f"token ids must be in [0, {vocab}), the model's vocabulary; "
                                    f"got {outside[0]}")
        if any(not 0 <= token < vocab for token in params.stop_token_ids):
            raise RequestFieldError("stop_token_ids", f"token ids must be in [0, {vocab}); no other id can be generated")
        if len(prompt_token_ids) >= self.max_model_len:
            raise RequestFieldError(
                "prompt", f"{len(prompt_token_ids)} tokens exceed the model's maximum context length of "
                f"{self.max_model_len} tokens; shorten the prompt"
            )
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise RequestFieldError(
                "max_tokens", f"the model's maximum context length is {self.max_model_len} tokens, but "
                f"{len(prompt_token_ids)} prompt tokens + max_tokens {params.max_tokens} exceed it; "
                f"lower max_tokens to at most {self.max_model_len - len(prompt_token_ids)}"
            )
        # Here, not in the API: max_tokens may be the default, the context the prompt leaves.
        if params.min_tokens > params.max_tokens:
            raise RequestFieldError("min_tokens", f"must be at most max_tokens ({params.max_tokens}), got "
                                    f"{params.min_tokens}; lower min_tokens or raise max_tokens")

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: AdapterHandle | None = None,
        tenant: TenantTag = DEFAULT_TENANT,
        cache_salt: str | None = None,
    ) -> None:
        """Validate a request and admit it (raises RequestFieldError, or AdapterLoadError).
        `tenant`: who asks (engine/tenancy.py); `cache_salt`: isolation within the tenant (Request.cache_salt)."""
        self.validate_request(prompt_token_ids, params)
        self.admit_request(request_id, prompt_token_ids, params, adapter, tenant, cache_salt=cache_salt)

    def admit_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: AdapterHandle | None = None,
        tenant: TenantTag = DEFAULT_TENANT,
        adapter_held: bool = False,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Admit a request that `validate_request` accepted; AsyncEngine validates before it queues one,
        so that each request is validated once. The scheduler refuses a request id already in use.
        `adapter_held`: the caller holds the adapter's host-cache entry already (`hold_adapter`, off the
        step thread) and hands that hold to the request, so the cache is read once per request.
        `arrival_time` (time.monotonic()): when the request reached the engine, if before now; its
        latency metrics count from there, so they include the adapter fetch and the wait to be admitted."""
        request = Request(request_id, list(prompt_token_ids), params, adapter, tenant=tenant, cache_salt=cache_salt)
        if params.grammar is not None:
            request.grammar = params.grammar.matcher()
        if adapter is not None and not adapter_held:
            # Held until the request ends, so that step() only copies the weights into a slot.
            self.adapter_cache.acquire(adapter)
        try:
            self.scheduler.add_request(request)
        except Exception:
            if adapter is not None:
                self.adapter_cache.release(adapter.key)
            raise
        detokenizer = None if self.tokenizer is None else IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids)
        eager = bool(params.stop)
        labels = self.metric_labels.of(*request.metrics_labels)
        self._tracked[request_id] = _Tracked(
            request=request,
            token_stops=(TokenStops(params, self.eos_token_ids) if request.grammar is None
                         else GrammarTokenStops(params, self.eos_token_ids, request.grammar)),
            stops=StopStringMatcher(params.stop) if eager else None,
            detokenizer=detokenizer if eager else None,
            deferred=None if eager or detokenizer is None else DeferredDetokenizer(detokenizer,
                                                                                  request.output_token_ids),
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            labels=labels,
            latency=self.latencies.series(labels),
        )
        generator = make_generator(params.seed, self.runner.device)
        if generator is not None:
            self._generators[request_id] = generator
        self.prompt_tokens_total += len(prompt_token_ids)
        self.requests_per_adapter[labels] += 1

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is and free its KV blocks and adapter slot reference."""
        tracked = self._drop(request_id)
        if tracked is not None:
            self.finished_requests[(*tracked.labels, "abort")] += 1

    def _drop(self, request_id: str) -> _Tracked | None:
        tracked = self._tracked.pop(request_id, None)
        if tracked is not None:
            self._generators.pop(request_id, None)
            self._release_adapter(self.scheduler.abort_request(request_id))
        return tracked

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        timings = StepTimings()
        started = time.perf_counter()
        step = self.scheduler.schedule()
        timings.schedule_s = time.perf_counter() - started
        self.preemptions_total += len(step.preempted_ids)
        if not step.scheduled:
            return []
        for slot, adapter in step.adapter_loads:  # rare: a copy into a GPU slot of weights a request holds
            loading = time.perf_counter()
            self.runner.load_adapter(slot, self.adapter_cache.held(adapter.key))
            # From the host cache, always: a request's adapter is fetched from storage before admission.
            logger.info("adapter %r loaded into slot %d", adapter.name, slot,
                        extra={"adapter_name": adapter.name, "adapter_key": adapter.key,
                               "tenant": runtime_key_scope(adapter.key), "slot": slot, "source": "host_cache",
                               "duration_ms": round((time.perf_counter() - loading) * 1000, 3)})
        sampled, failed_rows = self.runner.execute(step, self._generators, timings)
        executed = time.perf_counter()
        token_ids = [] if sampled is None else sampled.token_ids
        self.scheduler.update_after_step(step, token_ids)
        outputs = self._outputs(step.sampled_requests, token_ids, sampled, set(failed_rows))
        self.generation_tokens_total += len(outputs)
        timings.postprocess_s = time.perf_counter() - executed
        self.last_step_timings = timings
        return outputs

    def _outputs(self, requests: list[Request], token_ids: list[int], sampled,
                 failed_rows: set[int]) -> list[RequestOutput]:
        """Each request's output for its newly sampled token; finishes the requests that stopped,
        and fails those whose logits were not finite (failed_rows) without their token.

        The loop runs once per running request per step, so the common case (no stop strings, no
        logprobs) is a set lookup and one RequestOutput, its text left for whoever reads it.
        Every token of a step was sampled at once: one clock reading times them all, and the step's
        inter-token gaps enter their histogram under one lock.
        """
        outputs = []
        tracked_of = self._tracked
        now = time.monotonic()
        gaps: dict[LatencyHistogram, list[float]] = {}  # each label pair's gaps, observed under one lock
        for row, (request, token) in enumerate(zip(requests, token_ids)):
            if row in failed_rows:
                outputs.append(self._fail(request))
                continue
            tracked = tracked_of[request.request_id]
            if tracked.last_token_time is None:
                tracked.latency.time_to_first_token.observe(now - tracked.arrival_time)
            else:
                gaps.setdefault(tracked.latency.inter_token_latency, []).append(now - tracked.last_token_time)
            tracked.last_token_time = now
            num_output_tokens = len(request.output_token_ids)
            finish_reason = tracked.token_stops.check(token, num_output_tokens)
            if tracked.stops is not None:
                text, finish_reason = self._text_until_stop(tracked, token, finish_reason)
            else:
                text = None if tracked.deferred is not None else ""  # "": no tokenizer, token ids only
            if finish_reason is not None:
                tracked.latency.e2e_request_latency.observe(now - tracked.arrival_time)
                self.finished_requests[(*tracked.labels, finish_reason)] += 1
                self._finish(request, finish_reason)
            outputs.append(RequestOutput(
                request.request_id,
                [token],
                None if request.sampling_params.logprobs is None else self._logprobs(token, sampled, row),
                finish_reason is not None,
                finish_reason,
                len(request.prompt_token_ids),
                num_output_tokens,
                request.num_cached_tokens,
                text,
                tracked.deferred,
            ))
        for histogram, values in gaps.items():
            histogram.observe_all(values)
        return outputs

    @staticmethod
    def _text_until_stop(tracked: _Tracked, token: int, finish_reason: str | None) -> tuple[str, str | None]:
        """The text `token` adds for a request with stop strings, cut at a stop string, and the finish reason."""
        text = tracked.detokenizer.step(token)
        if finish_reason is not None:
            text += tracked.detokenizer.flush()
        text, hit_stop_string = tracked.stops.feed(text)
        if hit_stop_string:
            return text, "stop"
        if finish_reason is not None:
            text += tracked.stops.flush()
        return text, finish_reason

    def _fail(self, request: Request) -> RequestOutput:
        """End a request whose logits held NaN or Inf: its blocks and slot are freed, the step goes on."""
        adapter = "the base model" if request.adapter is None else f"adapter {request.adapter.name!r}"
        message = (f"generation failed: {adapter} produced non-finite values (NaN or infinity) for this request; "
                   "if it is an adapter, check its weights and lora_alpha")
        num_output_tokens = len(request.output_token_ids) - 1  # the token sampled from broken logits is dropped
        tracked = self._drop(request.request_id)
        # A failed request ended, as far as its client sees: its end-to-end latency counts (aborts' do not).
        tracked.latency.e2e_request_latency.observe(time.monotonic() - tracked.arrival_time)
        self.finished_requests[(*tracked.labels, "error")] += 1
        return RequestOutput(request.request_id, [], None, True, "error", len(request.prompt_token_ids),
                             max(num_output_tokens, 0), request.num_cached_tokens, "", None, message)

    def _finish(self, request: Request, finish_reason: str) -> None:
        status = RequestStatus.FINISHED_LENGTH if finish_reason == "length" else RequestStatus.FINISHED_STOPPED
        self.scheduler.finish_request(request.request_id, status)
        del self._tracked[request.request_id]
        self._generators.pop(request.request_id, None)
        self._release_adapter(request)

    def _release_adapter(self, request: Request) -> None:
        if request.adapter is not None:
            self.adapter_cache.release(request.adapter.key)

    def _logprobs(self, token: int, sampled, row: int) -> list[TokenLogprob]:
        top = sampled.top_logprobs[row] or []
        return [TokenLogprob(
            token_id=token,
            token=self.tokenizer.decode([token], skip_special_tokens=False),
            logprob=sampled.logprobs[row],
            top=[(tid, self.tokenizer.decode([tid], skip_special_tokens=False), lp) for tid, lp in top],
        )]

    # -------------------------------------------------------------------- stats
    def stats(self) -> EngineStats:
        """A reading of the engine's state and counters; any thread may take one (a scrape does)."""
        cache, slots, latencies = self.adapter_cache, self.slot_table, self.latencies.snapshot()
        # One reading of each queue: the LoRA info lists and the per-adapter counts agree.
        running, waiting = self.scheduler.running_adapter_counts(), self.scheduler.waiting_adapter_counts()
        tenants = self.scheduler.tenant_loads()
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_blocks_used=self.block_manager.num_used_blocks,
            kv_blocks_total=self.config.num_kv_blocks,
            kv_blocks_cached=self.block_manager.num_cached_blocks,
            adapter_slots_used=self.slot_table.num_used,
            adapter_slots_total=self.config.max_loras,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            preemptions_total=self.preemptions_total,
            running_per_adapter=running,
            waiting_per_adapter=waiting,
            requests_per_adapter_total=dict(self.requests_per_adapter),
            finished_requests_total=dict(self.finished_requests),
            block_size=self.config.block_size,
            running_lora_adapters=_adapter_names(running),
            waiting_lora_adapters=_adapter_names(waiting)[:MAX_LISTED_WAITING_ADAPTERS],
            host_cache_adapters=len(cache.keys()),
            host_cache_bytes=cache.nbytes,
            host_cache_capacity=cache.capacity,
            host_cache_hits_total=cache.hits,
            host_cache_misses_total=cache.misses,
            host_cache_evictions_total=cache.evictions,
            adapter_slot_loads_total=slots.loads,
            adapter_slot_evictions_total=slots.evictions,
            queued_per_tenant={name: load.queued for name, load in tenants.items()},
            running_per_tenant={name: load.running for name, load in tenants.items()},
            served_tokens_per_tenant={name: load.served_tokens for name, load in tenants.items()},
            share_counter_per_tenant={name: load.share_counter for name, load in tenants.items()},
            time_to_first_token=latencies.time_to_first_token,
            inter_token_latency=latencies.inter_token_latency,
            e2e_request_latency=latencies.e2e_request_latency,
        )


def _adapter_names(counts: dict[tuple[str, str], int]) -> list[str]:
    """The adapter names of per-(tenant, adapter) request counts, each once, in the counts' order (oldest
    request first); the base model left out. Tenants' same-named adapters become one name."""
    return list(dict.fromkeys(name for _, name in counts if name != BASE_ADAPTER_LABEL))
