"""Where a decode step's time goes on the GPU: engine step timings and a torch profiler table.

    python benchmarks/profile_decode.py [--batch 1] [--adapters 0|1|N] [--context 1024] [--num-layers 32]

Builds the Llama-3.1-8B shape with random weights (FP8 base), runs a few decode steps to warm
up, then prints the engine's per-phase host timings and the profiler's top ops by CPU and CUDA
time. A diagnostic for tuning, not part of the benchmark table.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _loraloom_shim

_loraloom_shim.use_source_tree()

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from gpusuite.adapters import write_random_adapter  # noqa: E402
from gpusuite.shapes import LLAMA_3_1_8B  # noqa: E402
from loraloom.engine.lora.host_cache import file_sha256  # noqa: E402
from loraloom.engine.lora.handle import AdapterHandle  # noqa: E402
from loraloom.engine.config import EngineConfig  # noqa: E402
from loraloom.engine.llm_engine import LLMEngine  # noqa: E402
from loraloom.engine.lora.weights import ADAPTER_WEIGHTS_FILE  # noqa: E402
from loraloom.engine.model.random_model import random_model  # noqa: E402
from loraloom.engine.request import SamplingParams  # noqa: E402
from loraloom.kernels.backend import get_backend  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--adapters", type=int, default=1, help="distinct rank-16 adapters (0 = base only)")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    model_config = dataclasses.replace(LLAMA_3_1_8B, num_layers=args.num_layers)
    config = EngineConfig(max_num_seqs=max(args.batch, 8), max_num_batched_tokens=8192, max_loras=max(args.adapters, 1),
                          max_lora_rank=16, dtype="bfloat16", device="cuda", quantization="fp8", num_kv_blocks=4096,
                          speculation="off")  # plain decode steps are profiled
    model = random_model(model_config, dtype, device, 0, get_backend(device))
    engine = LLMEngine.from_model(model, config)
    root = Path(tempfile.mkdtemp())
    handles: list[AdapterHandle | None] = []
    for index in range(args.adapters):
        directory = root / f"a{index}"
        write_random_adapter(directory, model_config, 16, index, dtype, device)
        handles.append(AdapterHandle(key=f"a{index}", name=f"a{index}", uri=directory.as_uri(),
                                     sha256=file_sha256(directory / ADAPTER_WEIGHTS_FILE)))
    generator = torch.Generator().manual_seed(0)
    for index in range(args.batch):
        prompt = torch.randint(model_config.vocab_size, (args.context,), generator=generator).tolist()
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True),
                           handles[index % len(handles)] if handles else None)
    for _ in range(args.batch * args.context // 8192 + 8):  # every prompt prefilled, then a few decodes
        engine.step()
    torch.cuda.synchronize()
    phases: dict[str, list[float]] = {}
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        for name, value in dataclasses.asdict(engine.last_step_timings).items():
            phases.setdefault(name, []).append(value)
    print(f"batch {args.batch}, adapters {args.adapters}, context {args.context}, layers {args.num_layers}")
    print(f"step wall median {statistics.median(walls) * 1e3:.2f} ms -> {args.batch / statistics.median(walls):.1f} tok/s")
    for name, values in phases.items():
        print(f"  {name:16s} {statistics.median(values) * 1e3:8.3f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            engine.step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
