"""Triton W8A8 FP8 linear for decode-sized batches (M tokens <= a few dozen), activation quantization fused in.

    y[t, n] = (sum_k e4m3(x[t, k] / sx[t]) * Wq[n, k]) * sx[t] * sw[n]     (fp32, rounded to x's dtype once)

with sx per token exactly as kernels/fp8.py quantize_per_token computes it (or a static scale).

Why not torch._scaled_mm at small M: cuBLAS tiles M = 1 like a 128-row GEMM and reaches about a
quarter of the copy bandwidth on an H100, and the separate quantization costs ~6 launches per
linear. At small M the weight read is the whole cost, so this kernel is built around it:

- Swapped operands: each program computes out^T tile = Wq tile [BLOCK_N, BLOCK_K] @ xq^T
  [BLOCK_K, BLOCK_M], so the weight rows fill the MMA's large M dimension and the handful of
  tokens its small N dimension (padded to 16, the least tl.dot takes); no tensor-core rows are
  spent on missing tokens, and each weight byte is loaded exactly once, K-contiguous.
- Fused quantization: the activation rows are tiny next to a weight tile (M x K x 2 bytes against
  BLOCK_N x K), so every program computes its rows' |max| over all of K itself (from L2 after the
  first program) and quantizes its x tile in registers; no x_q round trip, no extra launch.
- Split-K for narrow N: N = 4096 gives only 64 tiles of 64 rows for 132 SMs, so K is split and
  each split writes an fp32 partial [SPLIT_K, M, N]; a second, tiny launch sums the partials in
  split order (deterministic, unlike atomics) and applies the scales. SPLIT_K = 1 is one launch.
- Fusing the quantization repeats it in every program that shares the rows (hundreds for gate_up);
  `SmallMConfig.fuse_quant = False` runs kernels/fp8_quant.py first instead, and
  benchmarks/gpusuite/fp8_sweep.py measures which is faster.

CUDA-graph capturable: the grid comes from shapes and the config only; nothing is read back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from loraloom.kernels.dtypes import FP8_DTYPE
from loraloom.kernels.fp8_quant import quantize_per_token_triton, quantize_to_e4m3, scale_from_amax

MIN_BLOCK_M = 16  # tl.dot needs every dimension >= 16: 1..16 tokens share one padded tile
AMAX_TILE = 4096  # x elements per step of the |max| loop (BLOCK_M rows x AMAX_TILE / BLOCK_M columns)
TARGET_PROGRAMS = 264  # split K until about this many programs run: two per SM of an H100
REDUCE_BLOCK_N = 256
# Above this many tokens the default runs the quantization kernel first. Fused, every program
# reads its rows' whole K for the |max| (2 * M * K bytes from L2 per program): for o_proj with
# 320 programs that is ~16% of the weight bytes per token, on top of the repeated quantization
# arithmetic, while the separate kernel costs one launch. A first guess; fp8_sweep measures both.
FUSED_QUANT_MAX_M = 4


@dataclass(frozen=True)
class SmallMConfig:
    """One launch configuration of the small-M kernel; the defaults come from `default_config`."""

    block_n: int  # weight rows per program (the MMA's M dimension)
    block_k: int  # K per loop step
    split_k: int  # K splits; 1 = a single launch
    num_warps: int
    num_stages: int
    # True: each program quantizes its activation tile itself (one launch). False: the quantization
    # kernel runs first and the GEMM loads e4m3 activations (one more launch, but x is quantized
    # once instead of once per program: fewer instructions per weight byte).
    fuse_quant: bool = True

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"SmallMConfig.{name} = {value}: must be a power of two >= 16 (a tl.dot tile side)")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"SmallMConfig: split_k, num_warps and num_stages must be >= 1, got {self}")


def auto_split_k(n: int, k: int, block_n: int, block_k: int) -> int:
    """K splits that give every SM about two programs (none when N alone fills the device), at most one per K step."""
    tiles = triton.cdiv(n, block_n)
    return max(1, min(triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(k, block_k)))


def default_config(n: int, k: int, m: int = 1) -> SmallMConfig:
    """A weight-streaming config for m tokens through an [n, k] weight: 64-row tiles, 256-byte K
    steps, auto split-K, the quantization fused up to FUSED_QUANT_MAX_M tokens."""
    block_n, block_k = 64, 256
    return SmallMConfig(block_n, block_k, auto_split_k(n, k, block_n, block_k), num_warps=4, num_stages=4,
                        fuse_quant=m <= FUSED_QUANT_MAX_M)


@triton.jit
def _token_scales(x_ptr, input_scale_ptr, offs_m, m_mask, K, stride_x_row,
                  STATIC_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, AMAX_BLOCK_K: tl.constexpr):
    """[BLOCK_M] fp32 activation scales: the static one, or each row's |max| over all of K / 448."""
    if STATIC_SCALE:
        scale = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(input_scale_ptr)
    else:
        amax = tl.zeros([BLOCK_M, AMAX_BLOCK_K], dtype=tl.float32)
        for k in range(0, K, AMAX_BLOCK_K):
            offs_k = k + tl.arange(0, AMAX_BLOCK_K)
            x = tl.load(x_ptr + offs_m[:, None] * stride_x_row + offs_k[None, :],
                        mask=m_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
        scale = scale_from_amax(tl.max(amax, axis=1))
    return scale


@triton.jit
def _fp8_small_m_kernel(
    x_ptr,  # [M, K] bf16 / fp16 / fp32 (float8_e4m3fn when PREQUANTIZED), unit stride along K
    w_ptr,  # [N, K] float8_e4m3fn, unit stride along K
    w_scale_ptr,  # [N] fp32 (the [N, 1] tensor)
    input_scale_ptr,  # [1] fp32, read only when STATIC_SCALE
    out_ptr,  # [M, N] in x's dtype (SPLIT_K == 1)
    partial_ptr,  # [SPLIT_K, M, N] fp32 (SPLIT_K > 1)
    x_scale_ptr,  # [M] fp32: the token scales; written for the reduce pass (SPLIT_K > 1), read when PREQUANTIZED
    M, N, K, k_per_split,
    stride_x_row, stride_w_row, stride_out_row,
    STATIC_SCALE: tl.constexpr, PREQUANTIZED: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AMAX_BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if PREQUANTIZED:
        x_scale = tl.load(x_scale_ptr + offs_m, mask=m_mask, other=1.0)
    else:
        x_scale = _token_scales(x_ptr, input_scale_ptr, offs_m, m_mask, K, stride_x_row,
                                STATIC_SCALE, BLOCK_M, AMAX_BLOCK_K)

    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w_row
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_ptr + offs_m[None, :] * stride_x_row + offs_k[:, None],
                    mask=m_mask[None, :] & k_mask[:, None], other=0.0)  # [BLOCK_K, BLOCK_M]: x^T
        if PREQUANTIZED:
            x_q = x
        else:
            x_q = quantize_to_e4m3(x, x_scale[None, :])
        acc = tl.dot(w, x_q, acc)

    if SPLIT_K == 1:
        # The reference's order: (acc * sx) * sw, then one rounding to the output dtype.
        y = (acc * x_scale[None, :]) * tl.load(w_scale_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
        tl.store(out_ptr + offs_m[None, :] * stride_out_row + offs_n[:, None],
                 y.to(out_ptr.dtype.element_ty), mask=m_mask[None, :] & n_mask[:, None])
    else:
        partial = partial_ptr + pid_k * M * N
        tl.store(partial + offs_m[None, :] * N + offs_n[:, None], acc, mask=m_mask[None, :] & n_mask[:, None])
        if not PREQUANTIZED:
            if (pid_n == 0) & (pid_k == 0):
                tl.store(x_scale_ptr + offs_m, x_scale, mask=m_mask)


@triton.jit
def _fp8_split_k_reduce_kernel(
    partial_ptr, x_scale_ptr, w_scale_ptr, out_ptr,
    M, N, stride_out_row,
    SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (token, BLOCK_N columns): sum the splits in order 0..SPLIT_K-1, then scale."""
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(partial_ptr + (split * M + row) * N + offs_n, mask=n_mask, other=0.0)
    y = (acc * tl.load(x_scale_ptr + row)) * tl.load(w_scale_ptr + offs_n, mask=n_mask, other=0.0)
    tl.store(out_ptr + row * stride_out_row + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def fp8_linear_small_m(
    x: torch.Tensor,  # [M, K] bf16 / fp16 / fp32
    w_q: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N, 1] fp32
    input_scale: torch.Tensor | None = None,  # [1] fp32 static activation scale; None = per token
    config: SmallMConfig | None = None,
) -> torch.Tensor:  # [M, N] in x.dtype
    """kernels/fp8.py fp8_linear for a few tokens, in one launch (two with split-K)."""
    if x.dim() != 2 or x.shape[1] != w_q.shape[1]:
        raise ValueError(f"fp8_linear_small_m: x {list(x.shape)} does not match weight {list(w_q.shape)}")
    if w_q.dtype != FP8_DTYPE or w_scale.dtype != torch.float32 or w_scale.shape != (w_q.shape[0], 1):
        raise ValueError("fp8_linear_small_m: expected w_q float8_e4m3fn [N, K] and w_scale fp32 [N, 1], got "
                         f"{w_q.dtype} {list(w_q.shape)} and {w_scale.dtype} {list(w_scale.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if w_q.stride(1) != 1 or not w_scale.is_contiguous():
        raise ValueError("fp8_linear_small_m: w_q must have unit stride along K and w_scale be contiguous")
    m, k = x.shape
    n = w_q.shape[0]
    config = config or default_config(n, k, m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    x_scale = None
    if not config.fuse_quant:
        x, x_scale = quantize_per_token_triton(x, input_scale)  # the static scale, if any, is applied here
    block_m = max(MIN_BLOCK_M, triton.next_power_of_2(m))
    # Each split gets a whole number of BLOCK_K steps, so only the last split sees a ragged K edge.
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    split_k = triton.cdiv(k, k_per_split)  # a too-large split_k would leave empty splits: drop them
    static = input_scale is not None and config.fuse_quant
    scale_arg = input_scale if static else w_scale  # any fp32 pointer; never read without STATIC_SCALE
    if x_scale is None:
        x_scale = torch.empty(m, dtype=torch.float32, device=x.device)  # filled for the reduce pass
    partial = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device) if split_k > 1 else out
    grid = (triton.cdiv(n, config.block_n), split_k)
    _fp8_small_m_kernel[grid](
        x, w_q, w_scale, scale_arg, out, partial, x_scale,
        m, n, k, k_per_split, x.stride(0), w_q.stride(0), out.stride(0),
        STATIC_SCALE=static, PREQUANTIZED=not config.fuse_quant, SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, AMAX_BLOCK_K=max(64, AMAX_TILE // block_m),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split_k > 1:
        _fp8_split_k_reduce_kernel[(m, triton.cdiv(n, REDUCE_BLOCK_N))](
            partial, x_scale, w_scale, out, m, n, out.stride(0),
            SPLIT_K=split_k, BLOCK_N=REDUCE_BLOCK_N, num_warps=4,
        )
    return out
