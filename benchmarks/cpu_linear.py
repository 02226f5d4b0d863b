"""The CPU backend's linear (kernels/cpu_linear.py: the panel matmul in single-threaded column chunks, oneDNN
past MAX_CHUNKED_ROWS) against torch's F.linear, over one step's worth of the bundled model's layer shapes
(30 layers of qkv, o, gate_up and down, ~400 MB of float32 weights: they come from memory, as in a served
step), at several row counts.

    python benchmarks/cpu_linear.py [--rows 1 8 32 128 512] [--repeats 5]

Not a test: figures go to BENCHMARKS.md with the machine's load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from loraloom.kernels import cpu_linear

# (out, in) of the bundled SmolLM2-135M's qkv, o, gate_up and down projections.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


def step_seconds(weights: list[list[torch.Tensor]], rows: int, linear) -> float:
    inputs = {in_features: torch.randn(rows, in_features) for _, in_features in SHAPES}
    start = time.perf_counter()
    for layer in weights:
        for weight in layer:
            linear(inputs[weight.shape[1]], weight)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    weights = [[torch.randn(out_features, in_features) for out_features, in_features in SHAPES] for _ in range(LAYERS)]
    # Above MAX_CHUNKED_ROWS cpu_linear.linear is oneDNN's; the chunked op is timed there too.
    limit = cpu_linear.MAX_CHUNKED_ROWS
    with torch.inference_mode():
        for rows in args.rows:
            times: dict[str, list[float]] = {"F.linear": [], "chunked": []}
            cpu_linear.MAX_CHUNKED_ROWS = max(limit, rows)
            for _ in range(args.repeats):  # alternated, so the machine's drift hits both
                times["F.linear"].append(step_seconds(weights, rows, F.linear))
                times["chunked"].append(step_seconds(weights, rows, cpu_linear.linear))
            cpu_linear.MAX_CHUNKED_ROWS = limit
            torch_ms, chunked_ms = (1000 * statistics.median(times[label]) for label in times)
            print(f"{rows:>4} rows: F.linear {torch_ms:7.2f} ms, chunked {chunked_ms:7.2f} ms a step's linears "
                  f"({torch_ms / chunked_ms:.2f}x)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
