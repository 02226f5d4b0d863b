"""The issue's serving scenarios, run through the real LLMEngine on token ids.

Each group of scenarios builds the engine it needs (adapter slots and max rank differ) from the
same seeded random weights, and drops it before the next group is built. Adapters are random
PEFT directories loaded through the engine's normal path (fetch, sha256, validation, slot copy),
so cold loads are real. Prompts are random token ids, distinct per request, so the prefix
cache never turns a measurement into a cache hit. Every figure comes with the roofline bound
(gpusuite/roofline.py) for the same work.
"""
from __future__ import annotations

import itertools
import math
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpusuite.adapters import write_random_adapter
from gpusuite.ceilings import Ceilings, seconds_per_call
from gpusuite.roofline import Roofline
from gpusuite.shapes import Sizes
from gpusuite.table import Row
from loraloom.engine.lora.host_cache import file_sha256
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.layers import LoRASlotPool
from loraloom.engine.lora.weights import ADAPTER_WEIGHTS_FILE
from loraloom.engine.model.random_model import random_model
from loraloom.engine.request import SamplingParams
from loraloom.kernels.backend import get_backend

ADAPTER_RANK = 16  # the "rank-16 adapter"
WARM_STEPS = 2  # untimed decode steps before a timed window (kernels compile for new batch shapes)
ZIPF_EXPONENT = 1.1


def log(message: str) -> None:
    """Progress goes to stderr; stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


class AdapterStore:
    """Random rank-r adapters written once each, under root/r<rank>-<index>."""

    def __init__(self, root: Path, model_config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int):
        self.root = root
        self.model_config = model_config
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self._sha256: dict[tuple[int, int], str] = {}

    def handle(self, rank: int, index: int, key: str | None = None) -> AdapterHandle:
        """The adapter (rank, index), under runtime key `key` (several keys may share one file)."""
        directory = self.root / f"r{rank}-{index}"
        if (rank, index) not in self._sha256:
            write_random_adapter(directory, self.model_config, rank, self.seed + 1000 * rank + index, self.dtype,
                                 self.device)
            self._sha256[rank, index] = file_sha256(directory / ADAPTER_WEIGHTS_FILE)
        key = key or f"r{rank}-{index}"
        return AdapterHandle(key=key, name=key, uri=directory.as_uri(), sha256=self._sha256[rank, index])


@dataclass
class Setup:
    """What every scenario shares."""

    model_config: ModelConfig
    sizes: Sizes
    device: torch.device
    dtype: torch.dtype
    quantization: str | None
    fp8_activation_terms: int
    seed: int
    ceilings: Ceilings
    adapters: AdapterStore
    rng: random.Random = field(init=False)  # prompt tokens, seeded by `seed`
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(self.model_config.vocab_size) for _ in range(length)]

    def request_id(self) -> str:
        return f"bench-{next(self._ids)}"


def build_engine(setup: Setup, *, max_loras: int, max_lora_rank: int, max_num_seqs: int) -> LLMEngine:
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=setup.sizes.max_num_batched_tokens,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        dtype=str(setup.dtype).removeprefix("torch."),
        device=str(setup.device),
        quantization=setup.quantization,
        fp8_activation_terms=setup.fp8_activation_terms,
        speculation="off",  # the scenarios time plain decode steps: one token per request per step
    )
    model = random_model(setup.model_config, setup.dtype, setup.device, setup.seed, get_backend(setup.device))
    engine = LLMEngine.from_model(model, config)
    log(f"engine with {max_loras} slots of rank <= {max_lora_rank}: {engine.memory_plan.describe()}")
    _warm_up(engine, setup)
    return engine


def roofline(engine: LLMEngine, setup: Setup) -> Roofline:
    return Roofline.of(setup.model_config, setup.dtype, setup.ceilings, served=engine.runner.model,
                       quantized=setup.quantization is not None)


def _warm_up(engine: LLMEngine, setup: Setup) -> None:
    """Compile the kernels of the common batch shapes before anything is timed."""
    adapter = setup.adapters.handle(ADAPTER_RANK, 0)
    for handle in (None, adapter):
        engine.add_request(setup.request_id(), setup.prompt(setup.sizes.context), greedy(4), handle)
    engine.add_request(setup.request_id(), setup.prompt(16), greedy(4), None)
    while engine.has_unfinished():
        engine.step()


def _add(engine: LLMEngine, setup: Setup, prompt_len: int, max_tokens: int,
         adapters: list[AdapterHandle | None]) -> list[str]:
    ids = []
    for adapter in adapters:
        ids.append(setup.request_id())
        engine.add_request(ids[-1], setup.prompt(prompt_len), greedy(max_tokens), adapter)
    return ids


def _step_until_first_tokens(engine: LLMEngine, ids: list[str]) -> list[float]:
    """Step until each of `ids` has produced a token; the step times (seconds)."""
    waiting, times = set(ids), []
    while waiting:
        started = time.perf_counter()
        outputs = engine.step()
        times.append(time.perf_counter() - started)
        waiting -= {output.request_id for output in outputs}
    return times


def _run_to_completion(engine: LLMEngine) -> int:
    produced = 0
    while engine.has_unfinished():
        produced += len(engine.step())
    return produced


# ------------------------------------------------------------------ batch 1
def batch1_decode_rate(engine: LLMEngine, setup: Setup, adapter: AdapterHandle | None) -> float:
    """Decode tokens/s of one request at `context` tokens of context."""
    (request_id,) = _add(engine, setup, setup.sizes.context, setup.sizes.decode_steps + 1, [adapter])
    _step_until_first_tokens(engine, [request_id])
    started = time.perf_counter()
    produced = _run_to_completion(engine)
    return produced / (time.perf_counter() - started)


def batch1_rows(engine: LLMEngine, setup: Setup) -> tuple[list[Row], dict[str, float]]:
    """Batch-1 decode base and with one rank-16 adapter; the rows and the rates under "base" / "adapter"."""
    sizes, line = setup.sizes, roofline(engine, setup)
    adapter = setup.adapters.handle(ADAPTER_RANK, 0)
    context = sizes.context + sizes.decode_steps // 2
    rows, rates = [], {}
    cases = (("base", "base", None, []), ("adapter", f"1 adapter r{ADAPTER_RANK} all modules", adapter, [ADAPTER_RANK]))
    for key, label, handle, ranks in cases:
        rates[key] = rate = batch1_decode_rate(engine, setup, handle)
        ceiling = 1 / line.decode_step_seconds([context], ranks or [0], ranks)
        target = ">= 300" if handle is not None and setup.device.type == "cuda" else None
        rows.append(Row(f"batch-1 decode, {sizes.context} context, {label}", rate, "tok/s", ceiling, target))
    return rows, rates


# -------------------------------------------------------------- concurrency
def decode_tokens_held(sizes: Sizes) -> int:
    """KV tokens each request of decode_rate holds at the end of its timed window."""
    return sizes.concurrent_prompt + 1 + WARM_STEPS + sizes.decode_steps


def decode_rate(engine: LLMEngine, setup: Setup, adapters: list[AdapterHandle | None]) -> float:
    """Decode tokens/s with len(adapters) requests all running, after their prefills."""
    sizes = setup.sizes
    # No request may finish before the timed window ends: the first ones decode while the last ones prefill.
    ids = _add(engine, setup, sizes.concurrent_prompt, engine.max_model_len - sizes.concurrent_prompt, adapters)
    _step_until_first_tokens(engine, ids)
    if engine.scheduler.num_running != len(ids):
        raise RuntimeError(
            f"decode at concurrency {len(ids)}: only {engine.scheduler.num_running} requests run at once "
            f"(KV cache {engine.config.num_kv_blocks} blocks, max_num_seqs {engine.config.max_num_seqs}); "
            "lower the concurrency or the prompt length"
        )
    for _ in range(WARM_STEPS):
        engine.step()
    started = time.perf_counter()
    produced = sum(len(engine.step()) for _ in range(sizes.decode_steps))
    elapsed = time.perf_counter() - started
    for request_id in ids:
        engine.abort_request(request_id)
    if produced != len(ids) * sizes.decode_steps:
        raise RuntimeError(f"decode at concurrency {len(ids)}: {produced} tokens in {sizes.decode_steps} steps, "
                           f"expected {len(ids) * sizes.decode_steps}; requests were preempted (KV cache too small)")
    return produced / elapsed


def concurrency_rows(engine: LLMEngine, setup: Setup, label: str, ranks: tuple[int, ...],
                     base_rates: dict[int, float]) -> tuple[list[Row], dict[int, float]]:
    """Decode throughput at each concurrency: base only (`ranks` empty), or every request on one of
    num_adapters adapters whose ranks cycle through `ranks`, then also relative to `base_rates`
    (base-only tokens/s by concurrency) where known. Returns the rows and the rates by concurrency."""
    sizes, line = setup.sizes, roofline(engine, setup)
    context = sizes.concurrent_prompt + WARM_STEPS + sizes.decode_steps // 2
    adapter_ranks = [ranks[i % len(ranks)] for i in range(sizes.num_adapters)] if ranks else []
    handles = [setup.adapters.handle(rank, i) for i, rank in enumerate(adapter_ranks)]
    rows, rates = [], {}
    for concurrency in sizes.concurrency:
        assignment = [i % sizes.num_adapters for i in range(concurrency)] if ranks else []
        adapters = [handles[a] for a in assignment] if ranks else [None] * concurrency
        request_ranks = [adapter_ranks[a] for a in assignment] if ranks else [0] * concurrency
        distinct = [adapter_ranks[a] for a in sorted(set(assignment))]
        rates[concurrency] = rate = decode_rate(engine, setup, adapters)
        ceiling = concurrency / line.decode_step_seconds([context] * concurrency, request_ranks, distinct)
        name = f"decode c={concurrency}, {label}"
        rows.append(Row(name, rate, "tok/s", ceiling))
        if ranks and concurrency in base_rates:
            target = ">= 0.90" if setup.device.type == "cuda" else None
            rows.append(Row(f"{name} / base", rate / base_rates[concurrency], "x base", 1.0, target))
    return rows, rates


# ------------------------------------------------------------------ offline
def offline_rows(engine: LLMEngine, setup: Setup) -> list[Row]:
    """prompt-in / output-out requests, as many at once as the KV cache holds: output tokens/s."""
    sizes, line = setup.sizes, roofline(engine, setup)
    prompt, output = sizes.offline_prompt, sizes.offline_output
    blocks_each = -(-(prompt + output) // engine.config.block_size)
    count = min(sizes.offline_max_requests, engine.config.max_num_seqs, engine.config.num_kv_blocks // blocks_each)
    rows = []
    for label, rank, target in (("base", 0, ">= 15000"), (f"{sizes.num_adapters} adapters r{ADAPTER_RANK}",
                                                          ADAPTER_RANK, ">= 13500")):
        handles = [setup.adapters.handle(rank, i % sizes.num_adapters) if rank else None for i in range(count)]
        started = time.perf_counter()
        _add(engine, setup, prompt, output, handles)
        produced = _run_to_completion(engine)
        rate = produced / (time.perf_counter() - started)
        distinct = [rank] * min(count, sizes.num_adapters) if rank else []
        bound = (line.prefill_seconds(count, prompt, sizes.max_num_batched_tokens, distinct, count * prompt * rank)
                 + (output - 1) * line.decode_step_seconds([prompt + output // 2] * count, [rank] * count, distinct))
        rows.append(Row(f"offline {prompt} in / {output} out, {count} at once, {label}", rate, "out tok/s",
                        count * output / bound, target if setup.device.type == "cuda" else None))
    return rows


# --------------------------------------------------------------------- TTFT
def ttft_rows(engine: LLMEngine, setup: Setup) -> list[Row]:
    sizes, line = setup.sizes, roofline(engine, setup)
    samples = []
    for _ in range(sizes.ttft_repeats):
        (request_id,) = _add(engine, setup, sizes.context, 1, [None])
        started = time.perf_counter()
        _step_until_first_tokens(engine, [request_id])
        samples.append(time.perf_counter() - started)
    bound = line.prefill_seconds(1, sizes.context, sizes.max_num_batched_tokens, [], 0)
    return [Row(f"time to first token, {sizes.context}-token prompt, batch 1", statistics.median(samples) * 1e3, "ms",
                bound * 1e3, "<= 25" if setup.device.type == "cuda" else None, higher_is_better=False)]


# ---------------------------------------------------------------- cold load
def cold_load_rows(engine: LLMEngine, setup: Setup) -> list[Row]:
    """A never-seen adapter loaded from storage while other requests decode; and its slot copy alone."""
    sizes = setup.sizes
    background = _add(engine, setup, sizes.concurrent_prompt, engine.max_model_len - sizes.concurrent_prompt,
                      [None] * sizes.cold_load_background)
    _step_until_first_tokens(engine, background)
    quiet = _timed_steps(engine, sizes.decode_steps)
    cold = setup.adapters.handle(ADAPTER_RANK, sizes.num_adapters + 1, key="cold-load")
    fetch_s: list[float] = []
    loader = threading.Thread(target=lambda: fetch_s.append(_seconds(lambda: engine.load_adapter(cold))))
    loader.start()
    during = []
    while loader.is_alive():
        during += _timed_steps(engine, 1)
    loader.join()
    if not fetch_s:
        raise RuntimeError("cold load: the adapter fetch failed; see the thread's traceback above")
    (cold_id,) = _add(engine, setup, 16, 1, [cold])
    during += _step_until_first_tokens(engine, [cold_id])  # this step copies the adapter into its slot
    for request_id in background:
        engine.abort_request(request_id)

    weights = engine.adapter_cache.get(cold)
    pool = LoRASlotPool(setup.model_config, num_slots=1, max_rank=ADAPTER_RANK, dtype=setup.dtype, device=setup.device,
                        backend=get_backend(setup.device))
    slot_s = seconds_per_call(lambda: pool.load(0, weights), setup.device, 3)
    host_bytes = sum(m.lora_a.nbytes + m.lora_b.nbytes for m in weights.modules.values())
    h2d = setup.ceilings.host_to_device_bandwidth
    label = f"cold load r{ADAPTER_RANK}"
    return [
        Row(f"{label}: storage -> host (fetch, sha256, validate)", fetch_s[0] * 1e3, "ms", higher_is_better=False),
        Row(f"{label}: host -> GPU slot", slot_s * 1e3, "ms", None if h2d is None else host_bytes / h2d * 1e3,
            higher_is_better=False),
        Row(f"{label}: total", (fetch_s[0] + slot_s) * 1e3, "ms", higher_is_better=False),
        Row(f"decode step p99 of {sizes.cold_load_background} running requests during the load", p99(during) * 1e3,
            "ms", p99(quiet) * 1e3, higher_is_better=False),
    ]


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _timed_steps(engine: LLMEngine, count: int) -> list[float]:
    return [_seconds(engine.step) for _ in range(count)]


# --------------------------------------------------------------------- Zipf
def zipf_rows(engine: LLMEngine, setup: Setup) -> list[Row]:
    """Requests over zipf_adapters adapters drawn Zipf(1.1), zipf_slots GPU slots; against all on one adapter."""
    sizes = setup.sizes
    weights = [1.0 / (k + 1) ** ZIPF_EXPONENT for k in range(sizes.zipf_adapters)]
    draws = random.Random(setup.seed).choices(range(sizes.zipf_adapters), weights, k=sizes.zipf_requests)
    # Each adapter is its own runtime key (its own host entry and slot); their bytes come from a few files.
    zipf = [setup.adapters.handle(ADAPTER_RANK, k % sizes.zipf_weight_files, key=f"zipf-{k}") for k in draws]
    single = [setup.adapters.handle(ADAPTER_RANK, 0)] * sizes.zipf_requests
    rates = {}
    for label, handles in (("single", single), ("zipf", zipf)):
        started = time.perf_counter()
        _add(engine, setup, sizes.zipf_prompt, sizes.zipf_output, handles)
        rates[label] = _run_to_completion(engine) / (time.perf_counter() - started)
    shape = f"{sizes.zipf_requests} requests {sizes.zipf_prompt} in / {sizes.zipf_output} out"
    return [
        Row(f"{shape}, all on 1 adapter", rates["single"], "out tok/s"),
        Row(f"{shape}, Zipf(1.1) over {sizes.zipf_adapters} adapters ({len(set(draws))} drawn), "
            f"{sizes.zipf_slots} slots", rates["zipf"], "out tok/s"),
        Row("Zipf traffic / single adapter", rates["zipf"] / rates["single"], "x single", 1.0),
    ]
