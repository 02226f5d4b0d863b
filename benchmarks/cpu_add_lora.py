"""The CPU add_lora op alone over every wrapped linear of the bundled model: one step's LoRA work.

    python benchmarks/cpu_add_lora.py [--adapters 32] [--rows 1 8 16 40] [--lora-dtype auto|bfloat16|float16]
                                      [--adapters-saved-as bfloat16] [--ranks 2 40 64] [--modules k,up mlp]

The served benchmark's adapters (ranks 4-64, mixed module subsets) are loaded into the engine's slot
pool as serving loads them; each figure is the median time of one step's add_lora calls (4 linears
x 30 layers) with `--rows` tokens per adapter (1: decode; more: prefill segments), and the LoRA
bytes that step reads per second. The machine's read bandwidth is printed beside it. Not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import torch  # noqa: E402
from served.peers import local_adapter  # noqa: E402
from served.workload import SAVED_DTYPES, add_adapter_mix_arguments, specs_from_args, write_adapters  # noqa: E402

from loraloom.engine.config import LORA_DTYPES, EngineConfig  # noqa: E402
from loraloom.engine.llm_engine import LLMEngine  # noqa: E402
from loraloom.engine.lora.layers import build_sgmv_metadata  # noqa: E402
from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.engine.request import SamplingParams  # noqa: E402
from loraloom.kernels import packed_lora  # noqa: E402


def median_seconds(run, repeats: int = 15) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", type=int, default=32)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 40])
    parser.add_argument("--lora-dtype", choices=LORA_DTYPES, default="auto", help="the slot pool's dtype")
    parser.add_argument("--adapters-saved-as", choices=SAVED_DTYPES, default="float32")
    add_adapter_mix_arguments(parser)
    args = parser.parse_args()
    model_dir = import_bundled()
    specs = specs_from_args(args, args.adapters)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        write_adapters(model_dir, Path(tmp), specs, args.adapters_saved_as)
        engine = LLMEngine(model_dir, EngineConfig(max_loras=len(specs), max_lora_rank=max(s.rank for s in specs),
                                                lora_dtype=args.lora_dtype))
        # One one-token request per adapter puts every adapter into a slot, as serving does.
        for i, spec in enumerate(specs):
            handle = local_adapter(Path(tmp), spec.name)
            engine.load_adapter(handle)
            engine.add_request(f"load{i}", [1, 2, 3], SamplingParams(max_tokens=1), handle)
        while engine.has_unfinished():
            engine.step()
        pool = engine.runner.lora_pool
        slots = [slot for slot, rank in enumerate(pool.slot_ranks_host) if rank > 0]
        stacks = [stack for layer in pool.stacks for stack in layer.values()]
        lora_bytes = 0
        for stack in stacks:
            in_features, out_features = stack.in_features, stack.out_features
            for slot in slots:
                views = stack.slots[slot]  # None: the adapter targets none of this linear's modules
                if views is not None:
                    ranks = stack.ranks[slot].tolist()
                    lora_bytes += views.a_t.element_size() * sum(r * (in_features + out)
                                                                 for r, out in zip(ranks, out_features))
        big = torch.randn(128 * 1024 * 1024)
        bandwidth = big.nbytes / median_seconds(big.sum, 5)
        print(f"{len(slots)} adapters in slots, {lora_bytes / 1e6:.1f} MB of LoRA weights read per step; "
              f"machine read bandwidth (torch sum, {torch.get_num_threads()} threads) {bandwidth / 1e9:.1f} GB/s")
        for rows in args.rows:
            meta = build_sgmv_metadata([slot for slot in slots for _ in range(rows)], pool.slot_ranks_host, "cpu")
            calls = []
            for stack in stacks:
                offsets = [0]
                for out in stack.out_features:
                    offsets.append(offsets[-1] + out)
                calls.append((torch.randn(len(slots) * rows, stack.in_features), stack,
                              torch.zeros(len(slots) * rows, offsets[-1]), offsets))

            def step() -> None:
                for x, stack, out, offsets in calls:
                    packed_lora.add_lora(x, stack, meta, out, offsets)

            seconds = median_seconds(step)
            print(f"  {rows:>3} row(s) per adapter: {seconds * 1000:7.2f} ms a step, "
                  f"{lora_bytes / seconds / 1e9:5.1f} GB/s of LoRA weights")


if __name__ == "__main__":
    main()
