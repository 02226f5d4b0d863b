"""Host overhead of one decode step: everything the engine does per step besides the model.

Issue 2's target: at most 1 ms per decode step at 256 running requests over 64
adapters. The engine is built for the bundled model's shape and tokenizer
(random weights and random rank-8 adapter files, so nothing but the tokenizer
files is needed: it runs on the GPU box too), then its model is replaced by a
stub that returns fixed hidden states and logits whose argmax walks through the
tokens of real English text (modulo the stub's width, see --stub-vocab), so
detokenization and stop checks see real tokens while no model compute is timed. Each scenario adds its requests, runs
until all of them decode, then records `engine.last_step_timings` over the
measured steps and prints median milliseconds per phase:

    schedule     Scheduler.schedule()
    prepare      the runner's batch flattening and metadata (engine/step_batch.py + device tensors)
    sample       the sampler, logits in -> token ids out
    postprocess  scheduler update, detokenization, stop checks, outputs
    untimed      step wall time minus the model and the four phases (glue between them)
    host         step wall time minus the model: the figure the 1 ms target is about

    python benchmarks/host_overhead.py [--requests 256] [--adapters 64] [--steps 30] [--device cpu]
                                       [--clock thread] [--stub-vocab N] [--tokenizer-dir DIR]

--tokenizer-dir defaults to the bundled model's cache directory (imported on first use); a
directory holding just its tokenizer.json and tokenizer_config.json is enough.

`--clock thread` times every phase in CPU time of the stepping thread instead of wall time:
on a shared, oversubscribed machine wall-time phases absorb whole scheduler time slices,
while thread CPU time stays comparable between runs. It leaves out work done on other
threads (torch's intra-op pool), so wall time is the figure to report on a quiet machine.

`--stub-vocab N` makes the stub's logits N wide (its tokens then come from the first N ids). The
default is the model's vocabulary on a GPU and 1024 on the CPU: a vocabulary-wide argmax (256 x
49,152 fp32 logits) is device work that a GPU does (only ids come back), while on the CPU it would
cost ~5 ms of "sample" and evict the caches that the host phases then refill; the narrow stub
measures the host phases as a GPU host runs them. `--stub-vocab 49152` shows the CPU-only view.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from _loraloom_shim import use_source_tree  # noqa: E402

use_source_tree()

from gpusuite.adapters import write_random_adapter  # noqa: E402
from gpusuite.shapes import SMOLLM2_135M  # noqa: E402
from loraloom.engine.lora.handle import AdapterHandle  # noqa: E402
from loraloom.engine.config import SCHEDULING_POLICIES, EngineConfig  # noqa: E402
from loraloom.engine.llm_engine import LLMEngine  # noqa: E402
from loraloom.engine.model.random_model import random_model  # noqa: E402
from loraloom.engine.request import SamplingParams  # noqa: E402
from loraloom.engine.tenancy import TenantTag  # noqa: E402
from loraloom.engine.tokenizer import Tokenizer  # noqa: E402

# What the stub "generates": ordinary prose with some non-ASCII characters, so that some
# tokens end inside a multi-byte character and the detokenizer's hold-back path runs too.
SAMPLE_TEXT = (
    "The printing press changed how ideas travelled across Europe. Before it, a book was copied "
    "by hand, which took months; afterwards a workshop could print hundreds of copies in a week. "
    "Prices fell, literacy rose, and scholars in Mainz, Venice and Lyon could read the same text "
    "and argue about it. Café owners in Paris later sold pamphlets next to coffee — 1,200 titles "
    "a year by 1789. Naïve readers and sceptics alike: “who wrote this?” became a new question. "
)
CPU_STUB_VOCAB = 1024  # --stub-vocab's default on the CPU (module docstring)
PHASES = ("schedule", "prepare", "sample", "postprocess", "untimed", "host")


class StubModel:
    """Stands in for LlamaModel: zero hidden states, and logits whose argmax for row r at
    decode step s is the text's token (r * 37 + s) mod len, on top of fixed noise."""

    def __init__(self, hidden_size: int, vocab_size: int, text_tokens: list[int], max_rows: int, device: torch.device):
        self.hidden_size = hidden_size
        self.device = device
        self.text_tokens = torch.tensor(text_tokens, device=device)
        generator = torch.Generator().manual_seed(0)
        self.noise = torch.randn(max_rows, vocab_size, generator=generator).to(device)  # [rows, vocab] fp32
        # Logits go to one persistent buffer: a fresh 50 MB tensor per step would add the allocator's
        # map/unmap of it to the step (freed after the timed phases), which is the model's business.
        self.logits = torch.empty_like(self.noise)
        self.calls = 0

    def __call__(self, input_ids, positions, kv_caches, attn, lora) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden_size, device=self.device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] fp32
        rows = hidden.shape[0]
        logits = self.logits[:rows]
        logits.copy_(self.noise[:rows])
        picks = (torch.arange(rows, device=self.device) * 37 + self.calls) % len(self.text_tokens)
        logits[torch.arange(rows, device=self.device), self.text_tokens[picks]] = 20.0
        self.calls += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the stub's own work must land in model_s, not in the sampler's time
        return logits


def scenario_params(name: str, index: int, max_tokens: int) -> SamplingParams:
    """Per-request sampling parameters of each scenario."""
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if name == "greedy":
        return greedy
    if name == "greedy+stop":  # stop strings that never match: the matcher runs every step
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop=["\n\n###", "END"])
    if name == "mixed":  # a quarter sampled (half of those seeded), 1 in 16 with logprobs, 1 in 4 with stops
        kind = index % 16
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if kind % 4 else 0.8,
            top_p=0.9 if kind == 0 else 1.0,
            top_k=40 if kind == 4 else 0,
            seed=index if kind in (0, 8) else None,
            logprobs=2 if kind == 1 else None,
            stop=["END"] if kind % 4 == 2 else [],
            ignore_eos=True,
        )
    raise ValueError(f"scenario: unknown {name!r}; use greedy, greedy+stop or mixed")


def tenant_tags(count: int) -> list[TenantTag]:
    """Tenants for the requests to be spread over: the fair-share scheduler's bookkeeping is per tenant."""
    return [TenantTag(id=f"tenant{i}", name=f"tenant{i}") for i in range(count)]


def run_scenario(engine: LLMEngine, name: str, requests: int, adapters: list[AdapterHandle],
                 warmup: int, steps: int, tenants: list[TenantTag]) -> dict[str, float]:
    for i in range(requests):
        prompt = [1 + (i * 7 + j) % 1000 for j in range(8)]
        engine.add_request(f"{name}-{i}", prompt, scenario_params(name, i, warmup + steps + 2),
                           adapters[i % len(adapters)], tenants[i % len(tenants)])
    # Prefill, then a few decode steps so every request is decoding and caches are warm. A step computes
    # at least one token of each request it runs, so once none waits, every one has begun its prefill.
    while engine.scheduler.num_waiting:
        engine.step()
    for _ in range(warmup):
        engine.step()
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - started
        t = engine.last_step_timings
        host = wall - t.model_s
        for phase, value in (("schedule", t.schedule_s), ("prepare", t.prepare_s), ("sample", t.sample_s),
                             ("postprocess", t.postprocess_s), ("host", host),
                             ("untimed", host - t.host_overhead_s)):
            samples[phase].append(value)
    running = engine.scheduler.num_running
    while engine.has_unfinished():  # let the scenario's requests finish before the next one starts
        engine.step()
    return {phase: statistics.median(values) * 1000 for phase, values in samples.items()} | {"running": running}


def build_engine(tokenizer_dir: Path, requests: int, num_adapters: int, device: str,
                 stub_vocab: int | None = None, scheduling_policy: str = "fair") -> tuple[LLMEngine, list[AdapterHandle]]:
    model_config = SMOLLM2_135M
    root = Path(tempfile.mkdtemp(prefix="host_overhead_"))
    # One adapter file, many keys: the engine treats each key as a distinct adapter (own slot,
    # own prefix-cache identity), which is all the host side can tell apart.
    path = write_random_adapter(root / "adapter", model_config, rank=8, seed=1, dtype=torch.float32, device=device)
    adapters = [AdapterHandle(key=f"host{i}", name=f"adapter{i}", uri=path.as_uri()) for i in range(num_adapters)]
    dtype = "float32" if device == "cpu" else "bfloat16"
    config = EngineConfig(device=device, dtype=dtype, max_loras=num_adapters, max_lora_rank=8, max_num_seqs=requests,
                          max_num_batched_tokens=max(2048, requests * 16), num_kv_blocks=requests * 8,
                          scheduling_policy=scheduling_policy, speculation="off")  # a plain decode step's host work
    model = random_model(model_config, getattr(torch, dtype), device, seed=0)
    engine = LLMEngine.from_model(model, config, Tokenizer.from_dir(tokenizer_dir))
    vocab = stub_vocab or engine.model_config.vocab_size
    text_tokens = [token % vocab for token in engine.tokenizer.encode(SAMPLE_TEXT, add_special_tokens=False)]
    engine.runner.model = StubModel(engine.model_config.hidden_size, vocab, text_tokens, requests,
                                    engine.runner.device)
    return engine, adapters


@contextlib.contextmanager
def engine_clock(name: str):
    """Make the engine's phase timers (and ours) read `name`: "wall" (perf_counter) or "thread" (thread CPU time)."""
    from loraloom.engine import llm_engine as engine_module, model_runner

    clock = {"wall": time.perf_counter, "thread": time.thread_time}[name]
    saved = time.perf_counter
    # The engine modules call time.perf_counter through the shared `time` module object.
    time.perf_counter = clock
    try:
        assert engine_module.time is time and model_runner.time is time
        yield
    finally:
        time.perf_counter = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--adapters", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scenarios", default="greedy,greedy+stop,mixed")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--stub-vocab", type=int, default=None,
                        help="width of the stub's logits (default: the model's vocabulary on a GPU, 1024 on the CPU)")
    parser.add_argument("--tokenizer-dir", type=Path, default=None)
    parser.add_argument("--tenants", type=int, default=16, help="tenants the requests are spread over (round robin)")
    parser.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fair")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.tokenizer_dir is None:
        from loraloom.engine.model.bundled import import_bundled

        args.tokenizer_dir = import_bundled()
    if args.stub_vocab is None and torch.device(args.device).type == "cpu":
        args.stub_vocab = CPU_STUB_VOCAB
    engine, adapters = build_engine(args.tokenizer_dir, args.requests, args.adapters, args.device, args.stub_vocab,
                                    args.scheduling_policy)
    tenants = tenant_tags(args.tenants)
    print(f"decode step host overhead, median ms over {args.steps} steps, {args.requests} requests over "
          f"{args.adapters} adapters and {args.tenants} tenants ({args.scheduling_policy}), device {args.device}, {args.clock} clock, stub logits "
          f"{args.stub_vocab or engine.model_config.vocab_size} wide, torch {torch.__version__}")
    print(f"{'scenario':<12} {'running':>7} " + " ".join(f"{phase:>11}" for phase in PHASES))
    with engine_clock(args.clock):
        for name in args.scenarios.split(","):
            result = run_scenario(engine, name, args.requests, adapters, args.warmup, args.steps, tenants)
            print(f"{name:<12} {result['running']:>7} " + " ".join(f"{result[phase]:>11.3f}" for phase in PHASES))


if __name__ == "__main__":
    main()
