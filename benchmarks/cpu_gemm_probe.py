"""How fast a decode-shaped float32 matmul can run on this CPU, and whether a LoRA's reads can hide in it.

    python benchmarks/cpu_gemm_probe.py [--rows 8 32 128] [--layers 40] [--lora-bytes 1.0]

On one thread, for the bundled model's two linear shapes (576 -> 1536 and 1536 -> 576) stacked `--layers`
deep, so the weights come from memory as in a decode step: torch's matmul (MKL), oneDNN on weights
packed for it, and a plain AVX-512 matmul (benchmarks/cpu_gemm_probe.cpp) on weights packed once into
32-column panels. Then the probe again with `--lora-bytes` bytes of other memory per weight byte read
beside it (a 32-adapter float32 decode step of the served benchmark reads 461 MB of LoRA weights against
425 MB of base weights: ~1.1): read after each panel, and prefetched from inside the panel's loop first.

A probe for choosing the CPU path's next design, not a test and not a kernel the engine uses; the
findings are summed up in BENCHMARKS.md (why batch 32 sits near 0.90 on two cores). Needs AVX-512 (prints why not and exits otherwise).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def cpuinfo_value(key: str) -> str | None:
    """The first `key : value` line's value in /proc/cpuinfo (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def has_avx512() -> bool:
    return "avx512f" in (cpuinfo_value("flags") or "").split()


def cpu_model() -> str:
    return cpuinfo_value("model name") or platform.processor() or "unknown CPU"


def best_seconds(run, repeats: int = 3) -> float:
    """The fastest of `repeats` runs; `run` returns its own seconds or None to be timed here."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        seconds = run()
        times.append(seconds if isinstance(seconds, float) else time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128], help="M: multiples of 8")
    parser.add_argument("--layers", type=int, default=40, help="copies of each shape, so the weights outgrow the cache")
    parser.add_argument("--lora-bytes", type=float, default=1.0, help="bytes read beside the matmul per weight byte")
    args = parser.parse_args()
    if not has_avx512():
        print(f"{cpu_model()}: no AVX-512, which the probe kernel is written for; nothing measured")
        return 0
    bad_rows = [rows for rows in args.rows if rows <= 0 or rows % 8]
    if bad_rows:
        parser.error(f"--rows must be positive multiples of 8 (the probe has no row tail); got {bad_rows}")
    from torch.utils import cpp_extension

    # Built in torch's own extensions directory: a probe, not part of the product's compiled ops.
    probe = cpp_extension.load(name="cpu_gemm_probe", sources=[str(HERE / "cpu_gemm_probe.cpp")],
                               extra_cflags=["-O3", "-march=native"])
    torch.set_num_threads(1)
    stream = torch.randn(128 * 1024 * 1024)  # 512 MiB of other memory, read in order and wrapped
    print(f"{cpu_model()}, one thread; torch {torch.__version__} (CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()})")
    print(f"milliseconds per stack; + LoRA: {args.lora_bytes:g} bytes of other memory per weight byte")
    for in_features, out_features in [(576, 1536), (1536, 576)]:
        weight = torch.randn(out_features * args.layers, in_features)
        packed = probe.pack_weight(weight)
        print(f"{in_features} -> {out_features} x {args.layers} ({weight.nbytes / 1e6:.0f} MB of weights)")
        for rows in args.rows:
            x = torch.randn(rows, in_features)
            xt = x.t().contiguous()
            expected = torch.empty(rows, weight.shape[0])
            out = torch.empty_like(expected)
            mkl = best_seconds(lambda: torch.mm(x, weight.t(), out=expected))
            onednn_weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            onednn = best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, onednn_weight, None, "none", [], ""))
            plain = best_seconds(lambda: probe.probe_matmul(xt, packed, out, stream, 0.0, False))
            error = (out - expected).abs().max().item()
            scale = expected.abs().max().item()
            if not error <= 1e-5 * scale * in_features ** 0.5:
                print(f"  M {rows}: the probe's product is wrong (max error {error:.2e}); not timed")
                continue
            after = best_seconds(lambda: probe.probe_matmul(xt, packed, out, stream, args.lora_bytes, False))
            inside = best_seconds(lambda: probe.probe_matmul(xt, packed, out, stream, args.lora_bytes, True))
            print(f"  M {rows:>3}: MKL {mkl * 1e3:6.2f}  oneDNN packed {onednn * 1e3:6.2f}  probe {plain * 1e3:6.2f} "
                  f"({mkl / plain:.2f}x MKL) | probe + LoRA read after {after * 1e3:6.2f}, "
                  f"prefetched inside {inside * 1e3:6.2f} (max error vs MKL {error:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
