"""The e4m3 FP8 format as every kernel uses it: the dtype, its range, and the one rounding rule.

A leaf (torch only): the FP8 linear (kernels/fp8.py), the FP8 KV cache (kernels/kv_quant.py), the
plain-torch references and the Triton launchers all import it, and it imports none of them.
"""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# Floor on a row's |max| before it becomes a scale: an all-zero row gets a tiny positive scale
# (and quantizes to zeros) instead of 0 / 0 = NaN.
MIN_AMAX = 1e-12


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [R, C] / scale ([R, 1] or [1], fp32) rounded to e4m3; the one rounding rule of the kernels.

    Clamped first: a value beyond 448 must saturate, and whether a cast to float8_e4m3fn saturates
    or gives NaN (e4m3fn has no infinity) is not the same on every torch version and device.
    """
    assert scale.dim() > 0 and scale.dtype == torch.float32, "quantize_with_scale: scale must be fp32 [R, 1] or [1]"
    scaled = x / scale  # fp32: a dimensioned fp32 scale promotes bf16/fp16 rows to fp32 too
    return scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
