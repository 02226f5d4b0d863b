"""Tuning diagnostic (GPU only): device time of the small per-layer kernels, replayed from CUDA graphs.

    python benchmarks/sweep_decode.py

Decode attention at Llama-3.1-8B's heads for num_splits x DECODE_BLOCK_N (each with its error
against the reference), the eager launcher with the automatic split count, and the fused norm and
rotary kernels next to their torch references. Graph replay leaves out the Python launch cost, so
these are the times a captured decode step pays. Not part of the benchmark table.
"""
import torch
import _loraloom_shim
_loraloom_shim.use_source_tree()
from gpusuite import kernel_checks as kc
from loraloom.kernels import paged_decode, paged_attention, norm, reference

dev = torch.device("cuda")
dtype = torch.bfloat16
H, KVH, D = 32, 8, 128

def graph_time(fn, reps=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10): fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / reps / 10 * 1e3  # us per call

def eager_time(fn, reps=200):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3

gen = torch.Generator().manual_seed(0)
for batch, ctx in ((1, 1024), (1, 4096), (8, 1024), (64, 1024)):
    case = kc.attention_case([(ctx, 1)] * batch, dev, gen)
    shape = (case.num_blocks, 16, KVH, D)
    k = torch.randn(shape, device=dev).to(dtype); v = torch.randn(shape, device=dev).to(dtype)
    q = torch.randn(batch, H, D, device=dev).to(dtype)
    m = case.meta
    kv_bytes = 2 * batch * (ctx + 1) * KVH * D * 2
    auto = paged_decode.choose_num_splits(batch, KVH, m.block_tables.shape[1] * 16, dev)
    ref = reference.paged_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), case.meta_cpu, D ** -0.5)
    for bn in (32, 64, 128):
        paged_decode.DECODE_BLOCK_N = bn
        for splits in (1, 2, 4, 8, 16, 32):
            if splits * bn > ctx + bn: continue
            out = torch.empty_like(q)
            fn = lambda: paged_decode.paged_decode_attention(q, k, v, m.query_start_loc, m.seq_lens, m.block_tables, D ** -0.5, out, num_splits=splits)
            fn(); torch.cuda.synchronize()
            err = float((out.float().cpu() - ref).abs().max())
            t = graph_time(fn)
            print(f"B={batch:3d} ctx={ctx} BLOCK_N={bn:3d} splits={splits:2d}: {t:7.2f} us graph, {kv_bytes/t/1e3:7.0f} GB/s, err {err:.3g}", flush=True)
    paged_decode.DECODE_BLOCK_N = 64
    t_e = eager_time(lambda: paged_attention.paged_attention(q, k, v, m, D ** -0.5))
    print(f"B={batch} ctx={ctx} auto splits={auto}: eager paged_attention {t_e:.2f} us", flush=True)

for T in (1, 64, 1024):
    x = torch.randn(T, 4096, device=dev).to(dtype); r = torch.randn_like(x); w = torch.ones(4096, device=dev, dtype=dtype)
    tg = graph_time(lambda: norm.fused_add_rms_norm(x, r, w, 1e-5))
    tr = graph_time(lambda: reference.fused_add_rms_norm(x, r, w, 1e-5))
    te = eager_time(lambda: norm.fused_add_rms_norm(x, r, w, 1e-5))
    print(f"fused_add_rms_norm T={T}: triton {tg:.2f} us graph ({te:.2f} eager), torch reference {tr:.2f} us graph", flush=True)

from loraloom.kernels import rotary
for T in (1, 64):
    qkv = torch.randn(T, (H + 2 * KVH) * D, device=dev).to(dtype)
    q, kk, vv = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
    q, kk, vv = q.view(T, H, D), kk.view(T, KVH, D), vv.view(T, KVH, D)
    cos = torch.randn(T, D, device=dev).to(dtype); sin = torch.randn_like(cos)
    kc = torch.zeros(64, 16, KVH, D, device=dev, dtype=dtype); vc = torch.zeros_like(kc)
    slots = torch.arange(T, device=dev)
    tg = graph_time(lambda: rotary.rotary_write_kv_cache(q, kk, vv, cos, sin, kc, vc, slots))
    tr = graph_time(lambda: reference.rotary_write_kv_cache(q, kk, vv, cos, sin, kc, vc, slots))
    print(f"rotary_write_kv_cache T={T}: triton {tg:.2f} us graph, torch reference {tr:.2f} us graph", flush=True)
