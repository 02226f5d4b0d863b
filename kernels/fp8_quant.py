"""Triton per-token FP8 activation quantization: one launch instead of ~6 small torch ops per linear.

Bit for bit the semantics of kernels/fp8.py `quantize_per_token` / kernels/dtypes.py `quantize_with_scale`:

    sx[t]    = max(max_k |x[t, k]|, MIN_AMAX) / 448      (fp32, correctly rounded division)
    xq[t, k] = e4m3(clamp(x[t, k] / sx[t], -448, 448))   (fp32 division, round to nearest even)

Two details make "bit for bit" hold on both the GPU and Triton's CPU interpreter:
- `/` on fp32 compiles to an approximate division on NVIDIA GPUs; torch divides exactly, so the
  kernels use `tl.math.div_rn`.
- The rounding to e4m3 is done here in fp32/int32 arithmetic (`round_to_e4m3`), and the final
  cast only converts a value that is already on the e4m3 grid. The GPU's own cast rounds to
  nearest even too, but the interpreter's (triton 3.9) does not (1.0625 becomes 1.125), so a
  test of the native cast on the CPU would test nothing we ship.

The helpers here are shared with the small-M GEMM (kernels/fp8_gemm.py), which quantizes its
activation tile in registers with the same rules.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraloom.kernels.dtypes import FP8_DTYPE, FP8_MAX, MIN_AMAX

QUANT_BLOCK_K = 1024  # elements of a row per loop step: 2 KiB of bf16, 4 per thread at 8 warps
QUANT_NUM_WARPS = 8

_SMALLEST_NORMAL = 2.0 ** -6  # e4m3: exponent field 1; below it the grid step is fixed at 2^-9
_SUBNORMAL_STEPS = 512.0  # 1 / 2^-9
_ROUNDING_MAGIC = 8388608.0  # 2^23: adding it to 0 <= v < 2^22 rounds v to an integer, ties to even


@triton.jit
def round_to_e4m3(v):
    """fp32 values already clamped to [-448, 448] -> the nearest e4m3 value (ties to even), still fp32.

    Normal range: keep 3 mantissa bits of the fp32 pattern, rounding on the 20 dropped bits with
    the usual integer trick (add 0x7FFFF plus the lowest kept bit, then truncate). Subnormal range
    (|v| < 2^-6): the grid is the multiples of 2^-9, so round |v| * 512 to an integer by one fp32
    addition of 2^23 (exact scaling by powers of two on both sides). The sign bit is copied back
    from v, so -0.0 and tiny negatives give -0 as torch's cast does.
    """
    bits = v.to(tl.int32, bitcast=True)
    magnitude_bits = bits & 0x7FFFFFFF
    sign_bits = bits ^ magnitude_bits
    kept_lsb = (magnitude_bits >> 20) & 1
    normal_bits = (magnitude_bits + 0x7FFFF + kept_lsb) & -1048576  # -1048576 = 0xFFF00000: sign, exponent, 3 bits
    magnitude = magnitude_bits.to(tl.float32, bitcast=True)
    subnormal = ((magnitude * 512.0 + 8388608.0) - 8388608.0) * (1.0 / 512.0)
    rounded_bits = tl.where(magnitude < 0.015625, subnormal.to(tl.int32, bitcast=True), normal_bits)
    return (rounded_bits | sign_bits).to(tl.float32, bitcast=True)


@triton.jit
def quantize_to_e4m3(x, scale):
    """x (any float dtype) / scale (fp32, broadcastable) -> float8e4nv, the module's one rounding rule."""
    scaled = tl.math.div_rn(x.to(tl.float32), scale)
    clamped = tl.minimum(tl.maximum(scaled, -448.0), 448.0)
    return round_to_e4m3(clamped).to(tl.float8e4nv)


@triton.jit
def scale_from_amax(amax):
    """A row's |max| (fp32) -> its scale: floored at MIN_AMAX (all-zero rows), divided exactly by 448."""
    return tl.math.div_rn(tl.maximum(amax, 1e-12), 448.0)


@triton.jit
def row_scale(x_row, K, BLOCK_K: tl.constexpr):
    """The per-token scale of the K values at x_row: one pass for their |max|."""
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    return scale_from_amax(tl.max(amax, axis=0))


@triton.jit
def _quantize_per_token_kernel(
    x_ptr, x_q_ptr, scale_ptr, static_scale_ptr,
    K, stride_x_row, stride_q_row,
    STATIC_SCALE: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program per row: a pass for the row's |max| (skipped with a static scale), a pass to quantize.
    The second pass reads the row again from L1/L2: a row is at most a few tens of KiB."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    if STATIC_SCALE:
        scale = tl.load(static_scale_ptr)
    else:
        scale = row_scale(x_row, K, BLOCK_K)
    tl.store(scale_ptr + row, scale)
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        mask = offs < K
        x = tl.load(x_row + offs, mask=mask, other=0.0)
        tl.store(x_q_ptr + row * stride_q_row + offs, quantize_to_e4m3(x, scale), mask=mask)


def quantize_per_token_triton(
    x: torch.Tensor,  # [T, K] bf16 / fp16 / fp32, unit stride along K
    static_scale: torch.Tensor | None = None,  # [1] fp32: quantize with it instead of per-token scales
) -> tuple[torch.Tensor, torch.Tensor]:  # x_q [T, K] float8_e4m3fn (contiguous), x_scale [T, 1] fp32
    """kernels/fp8.py quantize_per_token (or quantize_with_scale with a static scale) in one launch.

    Graph-capturable: the grid is the row count, and nothing is read back to the host.
    """
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quantize_per_token_triton: x must be 2-D with unit stride along K, got shape "
                         f"{list(x.shape)} stride {list(x.stride())}; pass x.contiguous()")
    rows, k = x.shape
    x_q = torch.empty(rows, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if static_scale is not None and static_scale.dtype != torch.float32:
        raise ValueError(f"quantize_per_token_triton: static_scale must be fp32, got {static_scale.dtype}")
    if rows == 0:
        return x_q, scale
    _quantize_per_token_kernel[(rows,)](
        x, x_q, scale, static_scale if static_scale is not None else scale,
        k, x.stride(0), x_q.stride(0),
        STATIC_SCALE=static_scale is not None, BLOCK_K=QUANT_BLOCK_K, num_warps=QUANT_NUM_WARPS,
    )
    return x_q, scale


@triton.jit
def _two_term_rows_kernel(
    x_ptr, out_ptr, K, num_rows, stride_x_row, stride_out_row, BLOCK_K: tl.constexpr,
):
    """One program per row t: out[t] = q1 * s1 and out[num_rows + t] = q2 * s2 (fp32), where q1, s1 quantize
    x[t] per token and q2, s2 quantize its residual x[t] - q1 * s1. Three passes over the row: its |max|,
    the residual's |max|, the writes (the row is re-read from L1/L2)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    first_scale = row_scale(x_row, K, BLOCK_K)
    residual_amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        first = quantize_to_e4m3(x, first_scale).to(tl.float32) * first_scale
        residual_amax = tl.maximum(residual_amax, tl.abs(x - first))
    second_scale = scale_from_amax(tl.max(residual_amax, axis=0))
    for k in range(0, K, BLOCK_K):
        offs = k + tl.arange(0, BLOCK_K)
        mask = offs < K
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        first = quantize_to_e4m3(x, first_scale).to(tl.float32) * first_scale
        second = quantize_to_e4m3(x - first, second_scale).to(tl.float32) * second_scale
        tl.store(out_ptr + row * stride_out_row + offs, first, mask=mask)
        tl.store(out_ptr + (num_rows + row) * stride_out_row + offs, second, mask=mask)


def two_term_rows_triton(x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [2T, K] fp32
    """kernels/fp8.py two_term_rows in one launch (graph-capturable: the grid is the row count)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"two_term_rows_triton: x must be 2-D with unit stride along K, got shape "
                         f"{list(x.shape)} stride {list(x.stride())}; pass x.contiguous()")
    rows, k = x.shape
    out = torch.empty(2 * rows, k, dtype=torch.float32, device=x.device)
    if rows:
        _two_term_rows_kernel[(rows,)](x, out, k, rows, x.stride(0), out.stride(0),
                                       BLOCK_K=QUANT_BLOCK_K, num_warps=QUANT_NUM_WARPS)
    return out


# The jit helpers spell these constants out (a jit function sees only constexpr globals); keep
# them tied to the Python values they copy.
assert FP8_MAX == 448.0 and MIN_AMAX == 1e-12 and _SMALLEST_NORMAL == 0.015625
assert _SUBNORMAL_STEPS == 512.0 and _ROUNDING_MAGIC == 2.0 ** 23
