"""LLMEngine: the synchronous core. `add_request`, then `step()` until done.

One step = schedule -> copy newly admitted adapters into their slots -> run the
model -> sample (verifying drafts) -> advance the scheduler -> turn the sampled tokens
into outputs and find the requests that ended (engine/output_processor.py) -> free
what those held -> draft for the next step (engine/speculation/). The engine is single-threaded; AsyncEngine serializes all calls onto one thread.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

import torch

from loraloom.engine.lora.host_cache import AdapterFetcher, HostAdapterCache, fetch_local_dir
from loraloom.engine.lora.slots import AdapterSlotTable
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.files import runtime_key_scope
from loraloom.engine.config import EngineConfig
from loraloom.engine.field_error import RequestFieldError
from loraloom.engine.model.fp8 import quantize_model_fp8
from loraloom.engine.kv_cache import BlockManager
from loraloom.engine.model.kv_scales import prepare_kv_scales
from loraloom.engine.model.loader import load_model
from loraloom.engine.lora.layers import LoRASlotPool, attach_lora
from loraloom.engine.memory import plan_memory
from loraloom.engine.model.llama import LlamaModel
from loraloom.engine.model_runner import ModelRunner, StepTimings
from loraloom.engine.output_processor import EndedRequest, OutputProcessor
from loraloom.engine.outputs import MAX_LISTED_WAITING_ADAPTERS, EngineStats, RequestOutput
from loraloom.engine.request import BASE_ADAPTER_LABEL, Request, RequestStatus, SamplingParams
from loraloom.engine.sampler import make_generator
from loraloom.engine.scheduler import Scheduler
from loraloom.engine.speculation.speculator import Speculator
from loraloom.engine.structured_output import CompiledGrammar, GrammarCompiler
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag
from loraloom.engine.tokenizer import Tokenizer
from loraloom.kernels.backend import get_backend

logger = logging.getLogger(__name__)

HOST_ADAPTER_CACHE_SIZE = 64


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
        self.output_processor = OutputProcessor(tokenizer, self.eos_token_ids, config.metrics_max_adapters)
        labels = self.output_processor.metric_labels
        self.speculator = (None if config.speculation == "off" else
                           Speculator(config.speculative_max_tokens, self.max_model_len,
                                      lambda request: labels.of(*request.metrics_labels)))
        self._grammar_compiler: GrammarCompiler | None = None  # built on first use (about 0.2 s)
        self._grammar_compiler_lock = threading.Lock()
        # Seeded requests' own random streams; the runner reads None for every other request.
        self._generators: dict[str, torch.Generator] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.last_step_timings = StepTimings()

    # ----------------------------------------------------------------- requests
    def load_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch, verify and validate an adapter into the host cache (raises AdapterLoadError)."""
        self.adapter_cache.get(adapter)

    def hold_adapter(self, adapter: AdapterHandle) -> None:
        """`load_adapter`, and hold the host-cache entry for a request that `add_request(..., prepared=True)`
        will admit (the request's end releases it); or `release_adapter` if it never is."""
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
        *,
        arrival_time: float | None = None,
        prepared: bool = False,
    ) -> None:
        """Validate a request and admit it (raises RequestFieldError naming the field, or AdapterLoadError); the
        scheduler refuses a request id already in use.
        `tenant`: who asks (engine/tenancy.py); `cache_salt`: isolation within the tenant (Request.cache_salt).
        `arrival_time` (time.monotonic()): when the request reached the engine, if before now; its
        latency metrics count from there, so they include the adapter fetch and the wait to be admitted.
        `prepared`: the caller has run `validate_request` and, for an adapter, `hold_adapter` already, off
        the step thread (AsyncEngine does); the request is not validated again and takes that hold over,
        so that each request is validated once and reads the host cache once."""
        if not prepared:
            self.validate_request(prompt_token_ids, params)
        request = Request(request_id, list(prompt_token_ids), params, adapter, tenant=tenant, cache_salt=cache_salt)
        if params.grammar is not None:
            request.grammar = params.grammar.matcher()
        if adapter is not None and not prepared:
            # Held until the request ends, so that step() only copies the weights into a slot.
            self.adapter_cache.acquire(adapter)
        try:
            self.scheduler.add_request(request)
        except Exception:
            if adapter is not None:
                self.adapter_cache.release(adapter.key)
            raise
        self.output_processor.add_request(request, arrival_time)
        generator = make_generator(params.seed, self.runner.device)
        if generator is not None:
            self._generators[request_id] = generator
        self.prompt_tokens_total += len(prompt_token_ids)

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is and free its KV blocks and adapter slot reference."""
        if self.output_processor.abort_request(request_id):
            self._generators.pop(request_id, None)
            if self.speculator is not None:
                self.speculator.forget(request_id)
            self._release_adapter(self.scheduler.abort_request(request_id))

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
        sampled, failed = self.runner.execute(step, self._generators, timings)
        executed = time.perf_counter()
        self.scheduler.update_after_step(step, [] if sampled is None else sampled.token_ids)
        outputs, ended = self.output_processor.process(step.sampled_requests, sampled, set(failed))
        for finished in ended:
            self._free(finished)
        if self.speculator is not None:
            self.speculator.after_step(step, sampled, {finished.request.request_id for finished in ended},
                                       timings.model_s)
        self.generation_tokens_total += len(outputs)
        timings.postprocess_s = time.perf_counter() - executed
        self.last_step_timings = timings
        return outputs

    def _free(self, ended: EndedRequest) -> None:
        """Give back what an ended request holds: its KV blocks and slot, its random stream, its adapter hold."""
        request_id = ended.request.request_id
        self._generators.pop(request_id, None)
        if ended.finish_reason == "error":  # failed mid-generation: the scheduler drops it as it drops an abort
            self._release_adapter(self.scheduler.abort_request(request_id))
            return
        status = RequestStatus.FINISHED_LENGTH if ended.finish_reason == "length" else RequestStatus.FINISHED_STOPPED
        self.scheduler.finish_request(request_id, status)
        self._release_adapter(ended.request)

    def _release_adapter(self, request: Request) -> None:
        if request.adapter is not None:
            self.adapter_cache.release(request.adapter.key)

    # -------------------------------------------------------------------- stats
    def stats(self) -> EngineStats:
        """A reading of the engine's state and counters; any thread may take one (a scrape does)."""
        cache, slots, processed = self.adapter_cache, self.slot_table, self.output_processor
        latencies = processed.latencies.snapshot()
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
            requests_per_adapter_total=dict(processed.requests_per_adapter),
            finished_requests_total=dict(processed.finished_requests),
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
            **self._speculation_stats(),
            time_to_first_token=latencies.time_to_first_token,
            inter_token_latency=latencies.inter_token_latency,
            e2e_request_latency=latencies.e2e_request_latency,
        )

    def _speculation_stats(self) -> dict:
        """The speculator's counters and its answer store's size, as EngineStats fields ({} when off)."""
        speculator = self.speculator
        if speculator is None:
            return {}
        store = speculator.store.stats()
        return dict(spec_decode_drafts_total=dict(speculator.drafts),
                    spec_decode_draft_tokens_total=dict(speculator.draft_tokens),
                    spec_decode_accepted_tokens_total=dict(speculator.accepted_tokens),
                    spec_decode_emitted_tokens_total=dict(speculator.emitted_tokens),
                    spec_decode_store_tokens=store.tokens, spec_decode_store_bytes=store.bytes)


def _adapter_names(counts: dict[tuple[str, str], int]) -> list[str]:
    """The adapter names of per-(tenant, adapter) request counts, each once, in the counts' order (oldest
    request first); the base model left out. Tenants' same-named adapters become one name."""
    return list(dict.fromkeys(name for _, name in counts if name != BASE_ADAPTER_LABEL))
