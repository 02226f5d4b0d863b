"""Decode steps with distinct adapters against the same decodes on the base model, engine direct.

    python benchmarks/decode_ratio.py [--batches 8 32] [--rounds 4] [--new-tokens 40] [--lora-dtype bfloat16]
                                      [--ranks 2 40 64] [--modules k,up mlp]

The served benchmark's ratio mixes prefill and decode and crosses HTTP; this one isolates the
decode step, where a step of many distinct adapters reads every adapter's weights. One engine,
the served benchmark's adapters loaded once; each round runs the batch on distinct adapters, then
on the base model (alternated, so the VM's drift hits both), and the figure is the median time of
the steps that decode every request. Not a test: figures go to BENCHMARKS.md with the machine's load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from served.peers import chat_token_ids, local_adapter  # noqa: E402
from served.workload import add_adapter_mix_arguments, specs_from_args, uniform_requests, write_adapters  # noqa: E402

from loraloom.engine.config import LORA_DTYPES, EngineConfig  # noqa: E402
from loraloom.engine.llm_engine import LLMEngine  # noqa: E402
from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.engine.request import SamplingParams  # noqa: E402


def decode_step_times(engine: LLMEngine, prompts, handles, new_tokens: int, tag: str) -> list[float]:
    """Seconds of each step in which every request decoded one token (prefill steps left out)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, (prompt, handle) in enumerate(zip(prompts, handles)):
        engine.add_request(f"{tag}-{i}", prompt, params, handle)
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        if len(outputs) == len(prompts):
            times.append(seconds)
    return times[1:]  # the first full step may still carry a prefill's tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--lora-dtype", choices=LORA_DTYPES, default="auto", help="the slot pool's dtype")
    add_adapter_mix_arguments(parser)
    args = parser.parse_args()
    model_dir = import_bundled()
    specs = specs_from_args(args, max(args.batches))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        write_adapters(model_dir, Path(tmp), specs)
        # Plain decode steps are what is measured: one token per request per step, no drafts.
        engine = LLMEngine(model_dir, EngineConfig(max_loras=len(specs), max_lora_rank=max(s.rank for s in specs),
                                                lora_dtype=args.lora_dtype, speculation="off"))
        handles = [local_adapter(Path(tmp), spec.name) for spec in specs]
        for handle in handles:
            engine.load_adapter(handle)
        for batch in args.batches:
            prompts = chat_token_ids(model_dir, uniform_requests(batch, [None], args.new_tokens, seed=batch))
            runs = {"adapters": handles[:batch], "base": [None] * batch}
            for label, batch_handles in runs.items():  # warm: adapters into slots, first allocations
                decode_step_times(engine, prompts, batch_handles, 4, f"warm-{label}-{batch}")
            times: dict[str, list[float]] = {label: [] for label in runs}
            for round_index in range(args.rounds):
                for label, batch_handles in runs.items():
                    times[label] += decode_step_times(engine, prompts, batch_handles, args.new_tokens,
                                                      f"{label}-{batch}-{round_index}")
            adapters, base = (statistics.median(times[label]) for label in runs)
            print(f"batch {batch:>2}: decode step {adapters * 1000:6.1f} ms with {batch} distinct adapters, "
                  f"{base * 1000:6.1f} ms on the base model: ratio {base / adapters:.3f} (target >= 0.90)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
