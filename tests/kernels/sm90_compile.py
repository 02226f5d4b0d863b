"""Compile every kernel the launchers produce for an H100 (sm_90), down to the cubin, on a CPU.

The interpreter runs the kernels' arithmetic but accepts code the compiler rejects (types that
differ between branches, tl.dot shapes, shared memory). This script runs the real launchers on
CPU tensors of production shapes with the launch replaced by Triton's compile-only warmup
against an sm_90 target; ptxas ships with Triton, so no GPU or CUDA driver is needed.
Run in a process of its own, without TRITON_INTERPRET (test_compile_sm90.py does this).
Prints one line per compiled kernel: name, dtype, shared memory bytes.
"""
from __future__ import annotations

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from loraloom.kernels import fp8_gemm, fp8_quant, norm, paged_attention, paged_decode, rotary, sgmv
from loraloom.kernels.dtypes import FP8_DTYPE
from loraloom.kernels.metadata import AttentionMetadata
from loraloom.kernels.sgmv_plan import plan_sgmv

H100 = GPUTarget("cuda", 90, 32)


class CompileOnlyDriver:
    """What JITFunction asks the active driver for before it compiles: an H100, device 0."""

    def get_current_target(self) -> GPUTarget:
        return H100

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def compile_instead_of_launch(kernel: JITFunction, grid: tuple[int, ...]):
    def compile_for_h100(*args, **kwargs) -> None:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)
        assert "cubin" in compiled.asm, f"{kernel.fn.__name__}: no cubin was produced"
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
        print(kernel.fn.__name__, dtype, compiled.metadata.shared, flush=True)
    return compile_for_h100


def int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def compile_sgmv(dtype: torch.dtype) -> None:
    """Llama-3.1-8B q/k/v: hidden 4096 -> 4096 + 1024 + 1024, max rank 64, a decode-shaped batch."""
    # Padded like a CUDA-graph step: one spare segment and one spare tile.
    meta = plan_sgmv([0, 1, 2, -1, 3, 0], [8, 64, 16, 32], max_segments=5, max_tiles=5).to_metadata("cpu")
    x = torch.zeros(6, 4096, dtype=dtype)
    lora_a = [torch.zeros(4, 64, 4096, dtype=dtype) for _ in range(3)]
    shrunk = torch.zeros(3, 6, 64, dtype=dtype)
    sgmv.sgmv_shrink(x, lora_a, meta, shrunk, split_k=1)
    sgmv.sgmv_shrink(x, lora_a, meta, shrunk, split_k=4)
    lora_b = [torch.zeros(4, n, 64, dtype=dtype) for n in (4096, 1024, 1024)]
    sgmv.sgmv_expand(shrunk, lora_b, meta, torch.zeros(6, 6144, dtype=dtype), [0, 4096, 5120, 6144])


def compile_attention(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, fp8_cache: bool = False) -> None:
    """A decode request and a chunked-prefill request, so both launches compile; with an FP8 (e4m3)
    cache and its scales when fp8_cache."""
    starts, seq_lens = [0, 1, 5], [10, 20]
    meta = AttentionMetadata(
        query_start_loc=int32(starts), seq_lens=int32(seq_lens), block_tables=torch.zeros(2, 4, dtype=torch.int32),
        slot_mapping=torch.zeros(5, dtype=torch.int64), query_start_loc_host=starts, seq_lens_host=seq_lens,
    )
    k_cache = torch.zeros(8, 16, kv_heads, head_dim, dtype=FP8_DTYPE if fp8_cache else dtype)
    v_cache = torch.zeros_like(k_cache)
    scales = (torch.ones(1), torch.ones(1)) if fp8_cache else (None, None)
    kv = torch.zeros(5, kv_heads, head_dim, dtype=dtype)
    paged_attention.write_kv_cache(kv, kv, k_cache, v_cache, meta.slot_mapping, *scales)
    angles = torch.zeros(5, head_dim, dtype=dtype)
    rotary.rotary_write_kv_cache(torch.zeros(5, heads, head_dim, dtype=dtype), kv, kv, angles, angles,
                                 k_cache, v_cache, meta.slot_mapping, *scales)
    paged_attention.paged_attention(torch.zeros(5, heads, head_dim, dtype=dtype), k_cache, v_cache, meta, 0.1, *scales)
    # Split-KV decode (pass 1 with NUM_SPLITS > 1, and the combine pass), as at batch 1.
    query = torch.zeros(5, heads, head_dim, dtype=dtype)
    paged_decode.paged_decode_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                        meta.block_tables, 0.1, torch.empty_like(query), *scales, num_splits=8)


def compile_norms(dtype: torch.dtype, hidden: int) -> None:
    x = torch.zeros(3, hidden, dtype=dtype)
    weight = torch.ones(hidden, dtype=dtype)
    norm.rms_norm(x, weight, 1e-5)
    norm.fused_add_rms_norm(x, x, weight, 1e-5)


def compile_fp8(dtype: torch.dtype) -> None:
    """The per-token quantization (dynamic and static scale), the two-term rows, and the small-M GEMM at 1 and 32 tokens
    on Llama-3.1-8B's o_proj (split-K + reduce) and gate_up (one launch), dynamic and static, and
    once with the quantization kernel first instead of fused."""
    x = torch.zeros(32, 4096, dtype=dtype)
    static_scale = torch.ones(1)
    fp8_quant.quantize_per_token_triton(x)
    fp8_quant.quantize_per_token_triton(x, static_scale)
    fp8_quant.two_term_rows_triton(x)
    for n in (4096, 28672):
        w_q, w_scale = torch.zeros(n, 4096, dtype=FP8_DTYPE), torch.ones(n, 1)
        for tokens in (1, 32):
            fp8_gemm.fp8_linear_small_m(x[:tokens], w_q, w_scale)
        fp8_gemm.fp8_linear_small_m(x[:1], w_q, w_scale, static_scale)
    prequantized = fp8_gemm.SmallMConfig(64, 256, split_k=4, num_warps=4, num_stages=4, fuse_quant=False)
    fp8_gemm.fp8_linear_small_m(x[:1], torch.zeros(4096, 4096, dtype=FP8_DTYPE), torch.ones(4096, 1),
                                config=prequantized)


def main() -> None:
    assert isinstance(sgmv._sgmv_shrink_kernel, JITFunction), (
        "the kernels were decorated for the interpreter: run this script without TRITON_INTERPRET")
    driver.set_active(CompileOnlyDriver())
    JITFunction.__getitem__ = compile_instead_of_launch
    # bf16: the production dtype, which the interpreter cannot check; fp32: the "ieee" dot path.
    for dtype in (torch.bfloat16, torch.float32):
        compile_sgmv(dtype)
        compile_attention(dtype, heads=32, kv_heads=8, head_dim=128)  # Llama-3.1-8B
        compile_attention(dtype, heads=32, kv_heads=8, head_dim=128, fp8_cache=True)
        compile_fp8(dtype)
        compile_norms(dtype, hidden=4096)
    compile_attention(torch.bfloat16, heads=9, kv_heads=3, head_dim=64)  # SmolLM2-135M: group 3


if __name__ == "__main__":
    main()
