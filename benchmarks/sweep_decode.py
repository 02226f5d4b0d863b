"""Tuning diagnostic (GPU only): device time of the small per-layer kernels, replayed from CUDA graphs.

    python benchmarks/sweep_decode.py
    python benchmarks/sweep_decode.py --dry-run    # no GPU: imports, the kernels' names, the cases' shapes

Decode attention at Llama-3.1-8B's heads for num_splits x DECODE_BLOCK_N (each with its error
against the reference), the eager launcher with the automatic split count, and the fused norm and
rotary kernels next to their torch references. Graph replay leaves out the Python launch cost, so
these are the times a captured decode step pays. Not part of the benchmark table.
"""
from __future__ import annotations

import argparse
import sys

import torch

import _loraloom_shim

_loraloom_shim.use_source_tree()

from gpusuite import kernel_checks as kc  # noqa: E402
from gpusuite.shapes import LLAMA_3_1_8B  # noqa: E402
from loraloom.kernels import norm, paged_attention, paged_decode, reference, rotary  # noqa: E402

H, KVH, D = LLAMA_3_1_8B.num_heads, LLAMA_3_1_8B.num_kv_heads, LLAMA_3_1_8B.head_dim
HIDDEN = LLAMA_3_1_8B.hidden_size
ATTENTION_CASES = ((1, 1024), (1, 4096), (8, 1024), (64, 1024))  # (batch, context)
BLOCK_NS = (32, 64, 128)
SPLITS = (1, 2, 4, 8, 16, 32)
NORM_TOKENS = (1, 64, 1024)
ROTARY_TOKENS = (1, 64)
# Every kernel entry the sweep calls, by module: the dry run checks each exists.
KERNELS = {
    paged_decode: ("paged_decode_attention", "choose_num_splits", "DECODE_BLOCK_N"),
    paged_attention: ("paged_attention",),
    norm: ("fused_add_rms_norm",),
    rotary: ("rotary_write_kv_cache",),
    reference: ("paged_attention", "fused_add_rms_norm", "rotary_write_kv_cache"),
    kc: ("attention_case",),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="touch no GPU: check the kernels' names and build the attention cases on the CPU")
    return parser.parse_args(argv)


def dry_run(argv: list[str]) -> str:
    parse_args(argv)
    missing = [f"{module.__name__}.{name}" for module, names in KERNELS.items() for name in names
               if not hasattr(module, name)]
    if missing:
        raise ValueError(f"the sweep calls what the kernels no longer have: {missing}")
    if H * D != HIDDEN:
        raise ValueError(f"heads x head_dim {H} x {D} is not the hidden size {HIDDEN}")
    gen = torch.Generator().manual_seed(0)
    for batch, ctx in ATTENTION_CASES:
        case = kc.attention_case([(ctx, 1)] * batch, torch.device("cpu"), gen)
        if case.meta_cpu.block_tables.shape[1] * kc.BLOCK_SIZE < ctx + 1:
            raise ValueError(f"attention case B={batch} ctx={ctx}: its block table is too short")
    return f"{len(ATTENTION_CASES)} attention cases at {H}/{KVH} heads of {D}, norm and rotary at {HIDDEN}"


def graph_time(fn, reps=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps / 10 * 1e3  # us per call


def eager_time(fn, reps=200):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def sweep_attention(dev: torch.device, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    for batch, ctx in ATTENTION_CASES:
        case = kc.attention_case([(ctx, 1)] * batch, dev, gen)
        shape = (case.num_blocks, kc.BLOCK_SIZE, KVH, D)
        k = torch.randn(shape, device=dev).to(dtype)
        v = torch.randn(shape, device=dev).to(dtype)
        q = torch.randn(batch, H, D, device=dev).to(dtype)
        m = case.meta
        kv_bytes = 2 * batch * (ctx + 1) * KVH * D * 2
        auto = paged_decode.choose_num_splits(batch, KVH, m.block_tables.shape[1] * kc.BLOCK_SIZE, dev)
        ref = reference.paged_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), case.meta_cpu, D ** -0.5)
        for bn in BLOCK_NS:
            paged_decode.DECODE_BLOCK_N = bn
            for splits in SPLITS:
                if splits * bn > ctx + bn:
                    continue
                out = torch.empty_like(q)

                def fn():
                    paged_decode.paged_decode_attention(q, k, v, m.query_start_loc, m.seq_lens, m.block_tables,
                                                        D ** -0.5, out, num_splits=splits)
                fn()
                torch.cuda.synchronize()
                err = float((out.float().cpu() - ref).abs().max())
                t = graph_time(fn)
                print(f"B={batch:3d} ctx={ctx} BLOCK_N={bn:3d} splits={splits:2d}: {t:7.2f} us graph, "
                      f"{kv_bytes / t / 1e3:7.0f} GB/s, err {err:.3g}", flush=True)
        paged_decode.DECODE_BLOCK_N = 64
        t_e = eager_time(lambda: paged_attention.paged_attention(q, k, v, m, D ** -0.5))
        print(f"B={batch} ctx={ctx} auto splits={auto}: eager paged_attention {t_e:.2f} us", flush=True)


def sweep_norm_and_rotary(dev: torch.device, dtype: torch.dtype) -> None:
    for T in NORM_TOKENS:
        x = torch.randn(T, HIDDEN, device=dev).to(dtype)
        r = torch.randn_like(x)
        w = torch.ones(HIDDEN, device=dev, dtype=dtype)
        tg = graph_time(lambda: norm.fused_add_rms_norm(x, r, w, 1e-5))
        tr = graph_time(lambda: reference.fused_add_rms_norm(x, r, w, 1e-5))
        te = eager_time(lambda: norm.fused_add_rms_norm(x, r, w, 1e-5))
        print(f"fused_add_rms_norm T={T}: triton {tg:.2f} us graph ({te:.2f} eager), "
              f"torch reference {tr:.2f} us graph", flush=True)
    for T in ROTARY_TOKENS:
        qkv = torch.randn(T, (H + 2 * KVH) * D, device=dev).to(dtype)
        q, kk, vv = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q, kk, vv = q.view(T, H, D), kk.view(T, KVH, D), vv.view(T, KVH, D)
        cos = torch.randn(T, D, device=dev).to(dtype)
        sin = torch.randn_like(cos)
        k_cache = torch.zeros(64, kc.BLOCK_SIZE, KVH, D, device=dev, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.arange(T, device=dev)
        tg = graph_time(lambda: rotary.rotary_write_kv_cache(q, kk, vv, cos, sin, k_cache, v_cache, slots))
        tr = graph_time(lambda: reference.rotary_write_kv_cache(q, kk, vv, cos, sin, k_cache, v_cache, slots))
        print(f"rotary_write_kv_cache T={T}: triton {tg:.2f} us graph, torch reference {tr:.2f} us graph", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(dry_run(sys.argv[1:] if argv is None else argv))
        return 0
    dev, dtype = torch.device("cuda"), torch.bfloat16
    sweep_attention(dev, dtype)
    sweep_norm_and_rotary(dev, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
