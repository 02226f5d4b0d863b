"""Sweep the FP8 small-M Triton GEMM against torch._scaled_mm at decode sizes, and pick configs.

    python benchmarks/gpusuite/fp8_sweep.py          # CUDA (H100): Llama-3.1-8B projections, < 3 minutes
    python benchmarks/gpusuite/fp8_sweep.py --cpu    # tiny shapes under TRITON_INTERPRET (CI: it runs)
    python benchmarks/gpusuite/fp8_sweep.py --quick --dry-run   # no GPU: arguments, imports, the configs

First every variant is checked (nothing is timed until all pass; exit status 1 otherwise):
the Triton quantization kernel bit for bit against kernels/fp8.py quantize_per_token (dynamic
and static scales), every (config, M) of the small-M kernel and the _scaled_mm path against the
dequantizing reference, and one CUDA-graph capture and replay of the small-M kernel.
Then, on CUDA, triton.testing.do_bench medians (L2 flushed between calls, so weights stream
from HBM as in a decode step): per shape and M, each config's weight GB/s next to the measured
copy bandwidth, the best config, _scaled_mm (+ Triton quantization) for comparison, and the
largest M at which the Triton kernel still wins on every shape.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _loraloom_shim, gpusuite

import _loraloom_shim  # noqa: E402

_loraloom_shim.use_source_tree()

import torch  # noqa: E402

from loraloom.kernels.dtypes import quantize_with_scale  # noqa: E402
from loraloom.kernels.fp8 import _scaled_mm_rowwise, quantize_per_token, quantize_weight_per_channel  # noqa: E402
from loraloom.kernels.fp8_gemm import (  # noqa: E402
    FUSED_QUANT_MAX_M,
    SmallMConfig,
    auto_split_k,
    default_config,
    fp8_linear_small_m,
)  # noqa: E402
from loraloom.kernels.fp8_quant import quantize_per_token_triton  # noqa: E402
from gpusuite.shapes import LLAMA_3_1_8B  # noqa: E402
from loraloom.engine.config import ModelConfig  # noqa: E402
from loraloom.kernels.reference import fp8_scaled_mm  # noqa: E402


def projection_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """N x K of each fused projection GEMM of a decoder layer."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {"qkv": (q + 2 * kv, hidden), "o": (hidden, q), "gate_up": (2 * inter, hidden), "down": (hidden, inter)}


GPU_SHAPES = projection_shapes(LLAMA_3_1_8B)  # qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down 4096 x 14336
# Ragged on purpose: N and K not multiples of the tiles.
CPU_SHAPES = {"qkv": (96, 80), "o": (72, 72), "gate_up": (160, 72), "down": (72, 176)}
GPU_TOKENS = (1, 4, 16, 32, 64)
CPU_TOKENS = (1, 16)
LAYERS = LLAMA_3_1_8B.num_layers
LM_HEAD_BYTES = LLAMA_3_1_8B.vocab_size * LLAMA_3_1_8B.hidden_size * 2  # BF16
# (block_n, block_k, num_warps, num_stages); each runs with its automatic split-K and without
# splitting, and with the quantization fused and as a kernel of its own.
GPU_TILES = [(32, 256, 4, 4), (64, 256, 4, 4), (64, 512, 4, 3), (128, 256, 8, 3)]
# Compiling ~150 specializations one after another takes minutes: on CUDA, this many child
# processes first run the checks on disjoint parts of the variants, filling Triton's cache.
COMPILE_WORKERS = 12
CPU_TILES = [(32, 32, 4, 1)]
# |kernel - reference| / max |reference|: the kernel sums in another order and rounds to bf16 once.
TOLERANCE = 1e-2


@dataclass
class Case:
    name: str
    w_q: torch.Tensor
    w_scale: torch.Tensor


def configs_for(n: int, k: int, tiles: list[tuple[int, int, int, int]]) -> list[SmallMConfig]:
    configs = {default_config(n, k, m) for m in (1, FUSED_QUANT_MAX_M + 1)}
    for block_n, block_k, warps, stages in tiles:
        for split_k in {1, auto_split_k(n, k, block_n, block_k)}:
            for fuse_quant in (True, False):
                configs.add(SmallMConfig(block_n, block_k, split_k, warps, stages, fuse_quant))
    return sorted(configs, key=lambda c: (c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages, c.fuse_quant))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.float()
    return float((actual.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def check_quantization(device: torch.device, dtype: torch.dtype, k: int) -> list[str]:
    """Bitwise against quantize_per_token, on rows of six decades, zeros, huge and tiny values."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, k, generator=g) * 10.0 ** torch.empty(37, 1).uniform_(-3, 3, generator=g)
    x[0] = 0
    x[1, :4] = torch.tensor([-0.0, 1e-30, -1e-30, 3e4])
    x = x.to(dtype).to(device)
    failures = []
    for static in (None, torch.tensor([0.05], device=device)):
        q, s = quantize_per_token_triton(x, static)
        if static is None:
            ref_q, ref_s = quantize_per_token(x)
        else:
            ref_s = static.reshape(1, 1).expand(x.shape[0], 1).contiguous()
            ref_q = quantize_with_scale(x, ref_s)
        mode = "static" if static is not None else "per-token"
        if not (torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)):
            bad = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
            failures.append(f"quantize_per_token_triton {mode} {dtype}: {bad} codes differ from quantize_per_token")
    return failures


def check_gemms(case: Case, tokens: tuple[int, ...], tiles, device: torch.device,
                part: tuple[int, int] = (0, 1)) -> list[str]:
    """Every (config, M) against the reference; `part` (i, n) runs only every n-th variant from the i-th."""
    failures = []
    index = 0
    n, k = case.w_q.shape
    g = torch.Generator().manual_seed(1)
    for m in tokens:
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        for static in (None, torch.tensor([0.03], device=device)):
            if static is None:
                x_q, x_scale = quantize_per_token(x)
            else:
                x_scale = static.reshape(1, 1).expand(m, 1).contiguous()
                x_q = quantize_with_scale(x, x_scale)
            expected = fp8_scaled_mm(x_q, x_scale, case.w_q, case.w_scale, torch.float32)
            variants = configs_for(n, k, tiles) if static is None else [default_config(n, k, m)]
            for config in variants:
                index += 1
                if index % part[1] != part[0]:
                    continue
                error = relative_error(fp8_linear_small_m(x, case.w_q, case.w_scale, static, config), expected)
                if not error <= TOLERANCE:
                    failures.append(f"small-M {case.name} M={m} {config} static={static is not None}: "
                                    f"rel err {error:.2e}")
            if device.type == "cuda" and static is None and part == (0, 1):
                error = relative_error(_scaled_mm_rowwise(x_q, x_scale, case.w_q, case.w_scale, x.dtype), expected)
                if not error <= TOLERANCE:
                    failures.append(f"_scaled_mm {case.name} M={m}: rel err {error:.2e}")
    return failures


def check_graph_capture(case: Case, device: torch.device) -> list[str]:
    """Capture the kernel in a CUDA graph, change the input in place, replay: the output must follow."""
    x = torch.randn(1, case.w_q.shape[1], device=device).to(torch.bfloat16)
    fp8_linear_small_m(x, case.w_q, case.w_scale)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear_small_m(x, case.w_q, case.w_scale)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    error = relative_error(out, fp8_linear_small_m(x, case.w_q, case.w_scale))
    return [] if error == 0 else [f"CUDA graph replay of {case.name} differs from eager: rel err {error:.2e}"]


def copy_bandwidth(device: torch.device) -> float:
    """bytes/s read + written by a 1 GiB device copy (what gpusuite/ceilings.py measures)."""
    import triton.testing

    source = torch.ones(1 << 28, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / (triton.testing.do_bench(lambda: target.copy_(source)) * 1e-3)


def sweep(cases: list[Case], device: torch.device, bandwidth: float) -> None:
    import triton.testing

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=5, rep=25) * 1e-3  # median seconds

    best_at: dict[tuple[str, int], float] = {}
    scaled_at: dict[tuple[str, int], float] = {}
    for case in cases:
        n, k = case.w_q.shape
        weight_bytes = n * k
        for m in GPU_TOKENS:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            results = []
            for config in configs_for(n, k, GPU_TILES):
                seconds = bench(lambda: fp8_linear_small_m(x, case.w_q, case.w_scale, None, config))
                results.append((seconds, config))
            results.sort(key=lambda r: r[0])
            scaled = bench(lambda: _scaled_mm_rowwise(*quantize_per_token_triton(x), case.w_q, case.w_scale, x.dtype))
            best_at[case.name, m], scaled_at[case.name, m] = results[0][0], scaled
            print(f"\n{case.name} {n}x{k}, M={m}: weight GB/s (copy ceiling {bandwidth / 1e9:.0f} GB/s)")
            for seconds, config in results[:5]:
                print(f"  {weight_bytes / seconds / 1e9:7.0f} GB/s  {seconds * 1e6:7.1f} us  {config}")
            default = default_config(n, k, m)
            default_s = next(s for s, c in results if c == default)
            print(f"  default {weight_bytes / default_s / 1e9:7.0f} GB/s  {default_s * 1e6:7.1f} us  {default}")
            print(f"  _scaled_mm + triton quant {weight_bytes / scaled / 1e9:7.0f} GB/s  {scaled * 1e6:7.1f} us")
    for m in (1, 256, 2048):
        x = torch.randn(m, 4096, device=device).to(torch.bfloat16)
        triton_s, torch_s = bench(lambda: quantize_per_token_triton(x)), bench(lambda: quantize_per_token(x))
        print(f"\nquantize {m} x 4096: triton {triton_s * 1e6:.1f} us, torch ops {torch_s * 1e6:.1f} us")
    step = sum(best_at[case.name, 1] for case in cases) * LAYERS + LM_HEAD_BYTES / (bandwidth / 2)
    print(f"\nbatch-1 decode bound from these linears (+ BF16 lm_head at copy speed): {1 / step:.0f} tok/s")
    wins = [m for m in GPU_TOKENS if all(best_at[c.name, m] <= scaled_at[c.name, m] for c in cases)]
    threshold = max((m for m in wins if all(w in wins for w in GPU_TOKENS if w <= m)), default=0)
    print(f"suggested small-M threshold: M <= {threshold} (Triton wins on every shape up to there)")


def warm_triton_cache(quick: bool) -> None:
    """Run the GEMM checks split over COMPILE_WORKERS processes, so their compilations run in parallel."""
    flags = ["--quick"] if quick else []
    workers = [subprocess.Popen([sys.executable, __file__, *flags, "--compile-part", str(i), str(COMPILE_WORKERS)])
               for i in range(COMPILE_WORKERS)]
    for worker in workers:
        worker.wait()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET")
    parser.add_argument("--quick", action="store_true", help="CUDA: M in (1, 16) and two tiles only (~1 minute)")
    parser.add_argument("--compile-part", type=int, nargs=2, metavar=("I", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true",
                        help="touch no GPU: check the arguments and list the GEMM configs the run would check")
    args = parser.parse_args(argv)
    if args.quick:
        global GPU_TOKENS, GPU_TILES
        GPU_TOKENS, GPU_TILES = (1, 16), [(64, 256, 4, 4), (128, 256, 8, 3)]
    return args


def dry_run(argv: list[str]) -> str:
    """The run's variants, built on paper: every shape gets its configs (configs_for, default_config)."""
    args = parse_args(argv)
    shapes, tokens, tiles = (CPU_SHAPES, CPU_TOKENS, CPU_TILES) if args.cpu else (GPU_SHAPES, GPU_TOKENS, GPU_TILES)
    variants = sum(len(tokens) * len(configs_for(n, k, tiles)) for n, k in shapes.values())
    listed = ", ".join(f"{name} {n}x{k}" for name, (n, k) in shapes.items())
    return f"{listed}; M in {tokens}; {variants} GEMM variants to check"


def main() -> int:
    args = parse_args(None)
    if args.dry_run:
        print(dry_run(sys.argv[1:]))
        return 0
    if args.compile_part is None and not args.cpu:
        warm_triton_cache(args.quick)
    device = torch.device("cpu" if args.cpu else "cuda")
    shapes, tokens, tiles = (CPU_SHAPES, CPU_TOKENS, CPU_TILES) if args.cpu else (GPU_SHAPES, GPU_TOKENS, GPU_TILES)
    g = torch.Generator().manual_seed(2)
    cases = []
    for name, (n, k) in shapes.items():
        weight = (torch.randn(n, k, generator=g) * 0.02).to(device).to(torch.bfloat16)
        cases.append(Case(name, *quantize_weight_per_channel(weight)))
    failures = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        failures += check_quantization(device, dtype, k=cases[0].w_q.shape[1] + 3)
    for case in cases:
        failures += check_gemms(case, tokens, tiles, device, tuple(args.compile_part or (0, 1)))
    if args.compile_part is not None:
        return 0
    if device.type == "cuda":
        failures += check_graph_capture(cases[1], device)
    for failure in failures:
        print("FAIL", failure)
    if failures:
        return 1
    print(f"checks passed: quantization bitwise, {len(cases)} shapes x M in {tokens}, every config")
    if device.type == "cuda":
        sweep(cases, device, copy_bandwidth(device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
