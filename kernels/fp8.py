"""FP8 (e4m3) W8A8 linear: weights with one scale per output channel, activations with one per token.

The semantics, as a plain loop (what every path computes, up to fp32 summation order):

    sw[n] = max_k |W[n, k]| / 448            one scale per output channel, fixed at load
    sx[t] = max_k |x[t, k]| / 448            one scale per token, computed at each call
                                             (or a static per-tensor scale calibrated offline)
    Wq = e4m3(W / sw),  xq = e4m3(x / sx)    round to nearest even, clamped to +-448
    y[t, n] = sx[t] * sw[n] * sum_k xq[t, k] * Wq[n, k]     (summed in fp32, rounded to x's dtype once)

Per-token activation scales keep a request's numerics independent of its batch-mates, and
per-channel weight scales keep small output channels out of e4m3's subnormal range.

On CUDA devices with FP8 tensor cores the product runs in `torch._scaled_mm` with row-wise
scales (scale_a [T, 1], scale_b [1, N], both fp32 and contiguous; the activations row-major and the
weight column-major, i.e. w_q.t()), which applies sx[t] * sw[n] in the GEMM epilogue. The torch
versions this project supports (2.11 and later) accept row-wise scales on every NVIDIA device that
has FP8 GEMMs at all (compute capability >= 8.9, through CUTLASS or cuBLAS), so there is no
per-tensor fallback. Devices without FP8 GEMMs (compute capability < 8.9, and ROCm, whose MI300
uses the e4m3fnuz variant) and shapes _scaled_mm refuses (K or N not a multiple of 16) run the
plain-torch reference `kernels/reference.py:fp8_scaled_mm`, which is also the CPU path.
"""
from __future__ import annotations

import functools

import torch

from loraloom.kernels.reference import fp8_scaled_mm

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# Floor on a row's |max| before it becomes a scale: an all-zero row gets a tiny positive scale
# (and quantizes to zeros) instead of 0 / 0 = NaN.
MIN_AMAX = 1e-12
# torch._scaled_mm needs K and N to be multiples of 16.
SCALED_MM_ALIGNMENT = 16


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [R, C] / scale ([R, 1] or [1], fp32) rounded to e4m3; the one rounding rule of this module.

    Clamped first: a value beyond 448 must saturate, and whether a cast to float8_e4m3fn saturates
    or gives NaN (e4m3fn has no infinity) is not the same on every torch version and device.
    """
    assert scale.dim() > 0 and scale.dtype == torch.float32, "quantize_with_scale: scale must be fp32 [R, 1] or [1]"
    scaled = x / scale  # fp32: a dimensioned fp32 scale promotes bf16/fp16 rows to fp32 too
    return scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """[R, C] -> [R, 1] fp32: each row's |max| / 448, so that the row's largest value maps to 448."""
    amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, keepdim=True)  # max |x| in one pass, exact
    return amax.float().clamp_(min=MIN_AMAX) / FP8_MAX


def quantize_weight_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (w_q [out, in] float8_e4m3fn, w_scale [out, 1] fp32); weight ~= w_q * w_scale."""
    scale = row_scales(weight)
    return quantize_with_scale(weight, scale), scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] -> (x_q [T, in] float8_e4m3fn, x_scale [T, 1] fp32); x ~= x_q * x_scale."""
    scale = row_scales(x)
    return quantize_with_scale(x, scale), scale


def fp8_linear(
    x: torch.Tensor,  # [T, in] bf16 / fp16 / fp32
    w_q: torch.Tensor,  # [out, in] float8_e4m3fn
    w_scale: torch.Tensor,  # [out, 1] fp32
    input_scale: torch.Tensor | None = None,  # [1] fp32: a static activation scale; None = per token
) -> torch.Tensor:  # [T, out] in x.dtype
    """y = x @ W.T with W = w_q * w_scale, x quantized to e4m3 per token (or with `input_scale`)."""
    assert x.dim() == 2 and x.shape[1] == w_q.shape[1], f"fp8_linear: x {list(x.shape)} vs weight {list(w_q.shape)}"
    assert w_q.dtype == FP8_DTYPE and w_scale.shape == (w_q.shape[0], 1) and w_scale.dtype == torch.float32
    if input_scale is None:
        x_q, x_scale = quantize_per_token(x)
    else:
        # Row-wise _scaled_mm wants a contiguous [T, 1] scale, not a stride-0 broadcast.
        x_scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
        x_q = quantize_with_scale(x, x_scale)
    if _runs_scaled_mm(x.device, w_q.shape):
        return _scaled_mm_rowwise(x_q, x_scale, w_q, w_scale, x.dtype)
    return fp8_scaled_mm(x_q, x_scale, w_q, w_scale, x.dtype)


def _scaled_mm_rowwise(
    x_q: torch.Tensor,  # [T, K] float8, row-major
    x_scale: torch.Tensor,  # [T, 1] fp32
    w_q: torch.Tensor,  # [N, K] float8, row-major, so w_q.t() is the column-major [K, N] _scaled_mm needs
    w_scale: torch.Tensor,  # [N, 1] fp32; .t() is the [1, N] row-wise layout of scale_b
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [T, N]
    return torch._scaled_mm(x_q.contiguous(), w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=out_dtype)


def _runs_scaled_mm(device: torch.device, weight_shape: torch.Size) -> bool:
    out_features, in_features = weight_shape
    aligned = out_features % SCALED_MM_ALIGNMENT == 0 and in_features % SCALED_MM_ALIGNMENT == 0
    return device.type == "cuda" and aligned and fp8_gemm_available(device.index)


@functools.lru_cache(maxsize=None)
def fp8_gemm_available(device_index: int | None) -> bool:
    """Whether this CUDA device has e4m3fn FP8 GEMMs: NVIDIA (not ROCm) at compute capability >= 8.9.

    Cached: the answer is a property of the hardware, and it is asked once per linear per step.
    """
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index) >= (8, 9)
