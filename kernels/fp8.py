"""FP8 (e4m3) W8A8 linear: weights with one scale per output channel, activations with one per token.

The semantics, as a plain loop (what every path computes, up to fp32 summation order):

    sw[n] = max_k |W[n, k]| / 448            one scale per output channel, fixed at load
    sx[t] = max_k |x[t, k]| / 448            one scale per token, computed at each call
                                             (or a static per-tensor scale calibrated offline)
    Wq = e4m3(W / sw),  xq = e4m3(x / sx)    round to nearest even, clamped to +-448
    y[t, n] = sx[t] * sw[n] * sum_k xq[t, k] * Wq[n, k]     (summed in fp32, rounded to x's dtype once)

Per-token activation scales keep a request's numerics independent of its batch-mates, and
per-channel weight scales keep small output channels out of e4m3's subnormal range.

Two-term activations (`fp8_linear(..., two_term=True)`, quantize_per_token_two_term): each token is
also quantized a second time, the residual r = x - sx * xq with its own per-token scale, and

    y[t, n] = sw[n] * (sx[t] * sum_k xq[t, k] * Wq[n, k] + sr[t] * sum_k rq[t, k] * Wq[n, k])

i.e. one GEMM over the 2T stacked rows [xq; rq] with row-wise scales [sx; sr], the two halves added in
fp32 and rounded once (the reference path, with no FP8 GEMM, sums the two terms first and runs one
GEMM of T rows: the same product to fp32 rounding). The activations then carry ~7 mantissa bits
instead of 3; the weights are read once as before, so at decode (weight-bandwidth bound) it costs
almost nothing, at prefill twice the FLOPs.

On CUDA devices with FP8 tensor cores the product runs in `torch._scaled_mm` with row-wise
scales (scale_a [T, 1], scale_b [1, N], both fp32 and contiguous; the activations row-major and the
weight column-major, i.e. w_q.t()), which applies sx[t] * sw[n] in the GEMM epilogue. The torch
versions this project supports (2.11 and later) accept row-wise scales on every NVIDIA device that
has FP8 GEMMs at all (compute capability >= 8.9, through CUTLASS or cuBLAS), so there is no
per-tensor fallback. Devices without FP8 GEMMs (compute capability < 8.9, and ROCm, whose MI300
uses the e4m3fnuz variant) and shapes _scaled_mm refuses (K or N not a multiple of 16) run the
plain-torch reference `kernels/reference.py:fp8_scaled_mm`, which is also the CPU path.

On those CUDA devices, given the Triton kernels (`TritonFp8Linear`, the op of the Triton backend
in kernels/backend.py's table), `fp8_linear` picks one of two fast paths by the number of tokens
(`fp8_linear_path`):
- up to SMALL_M_THRESHOLD tokens (decode steps): the Triton small-M kernel (kernels/fp8_gemm.py),
  which quantizes the activations itself and streams the weight once, in one launch (two with
  split-K); cuBLAS tiles such batches like big GEMMs and reads the weight at a quarter of the
  bandwidth;
- more tokens (prefill): the Triton quantization kernel (kernels/fp8_quant.py, one launch
  instead of ~6 torch ops), then `torch._scaled_mm`.
Both compute the semantics above; only the fp32 summation order differs from the reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from loraloom.kernels.dtypes import FP8_DTYPE, FP8_MAX, MIN_AMAX, quantize_with_scale
from loraloom.kernels.reference import dequantized_fp8_mm, fp8_scaled_mm

# torch._scaled_mm needs K and N to be multiples of 16.
SCALED_MM_ALIGNMENT = 16
# Largest token count that runs the Triton small-M kernel on CUDA; above it, _scaled_mm.
# benchmarks/gpusuite/fp8_sweep.py measures where the small-M kernel stops winning.
SMALL_M_THRESHOLD = 16


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


def quantize_per_token_two_term(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] -> (x_q [2T, in] float8_e4m3fn, x_scale [2T, 1] fp32): rows 0..T-1 are quantize_per_token(x),
    rows T..2T-1 quantize_per_token of what they missed (x - x_q[:T] * x_scale[:T], in fp32), so that
    x ~= x_q[:T] * x_scale[:T] + x_q[T:] * x_scale[T:] with ~2^-4 of the one-term error."""
    first_q, first_scale = quantize_per_token(x)
    residual = x.float() - first_q.float() * first_scale
    second_q, second_scale = quantize_per_token(residual)
    return torch.cat([first_q, second_q]), torch.cat([first_scale, second_scale])


@dataclass(frozen=True)
class TritonFp8Linear:
    """fp8_linear with the Triton kernels to use on FP8 CUDA devices: the Triton backend's op.

    kernels/backend.py's get_backend builds it from kernels/fp8_gemm.py and kernels/fp8_quant.py, so
    that this module, like the backend table, imports no Triton on machines without it.
    """

    linear_small_m: Callable[..., torch.Tensor]  # fp8_gemm.fp8_linear_small_m
    quantize_per_token: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # fp8_quant.quantize_per_token_triton
    two_term_rows: Callable[[torch.Tensor], torch.Tensor]  # fp8_quant.two_term_rows_triton

    def __call__(self, x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                 input_scale: torch.Tensor | None = None, two_term: bool = False) -> torch.Tensor:
        return fp8_linear(x, w_q, w_scale, input_scale, two_term, triton=self)


def fp8_linear(
    x: torch.Tensor,  # [T, in] bf16 / fp16 / fp32
    w_q: torch.Tensor,  # [out, in] float8_e4m3fn
    w_scale: torch.Tensor,  # [out, 1] fp32
    input_scale: torch.Tensor | None = None,  # [1] fp32: a static activation scale; None = per token
    two_term: bool = False,  # activations as two e4m3 terms per token (quantize_per_token_two_term)
    triton: TritonFp8Linear | None = None,  # the Triton kernels, where the backend has them
) -> torch.Tensor:  # [T, out] in x.dtype
    """y = x @ W.T with W = w_q * w_scale, x quantized to e4m3 per token (or with `input_scale`), or,
    with `two_term`, to the sum of two e4m3 terms per token (see the module docstring)."""
    assert x.dim() == 2 and x.shape[1] == w_q.shape[1], f"fp8_linear: x {list(x.shape)} vs weight {list(w_q.shape)}"
    assert w_q.dtype == FP8_DTYPE and w_scale.shape == (w_q.shape[0], 1) and w_scale.dtype == torch.float32
    if two_term:
        return _fp8_linear_two_term(x, w_q, w_scale, input_scale, triton)
    path = fp8_linear_path(x.device, x.shape[0], w_q.shape, triton is not None)
    if path == "triton_small_m":
        return triton.linear_small_m(x, w_q, w_scale, input_scale)
    if path == "triton_quant_scaled_mm":
        x_q, x_scale = triton.quantize_per_token(x.contiguous(), input_scale)
        return _scaled_mm_rowwise(x_q, x_scale, w_q, w_scale, x.dtype)
    if input_scale is None:
        x_q, x_scale = quantize_per_token(x)
    else:
        # Row-wise _scaled_mm wants a contiguous [T, 1] scale, not a stride-0 broadcast.
        x_scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
        x_q = quantize_with_scale(x, x_scale)
    if path == "scaled_mm":
        return _scaled_mm_rowwise(x_q, x_scale, w_q, w_scale, x.dtype)
    return fp8_scaled_mm(x_q, x_scale, w_q, w_scale, x.dtype)


def _fp8_linear_two_term(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, input_scale: torch.Tensor | None,
    triton: TritonFp8Linear | None,
) -> torch.Tensor:
    """Both terms' rows through the one-term fp8_linear as one [2T, in] batch with fp32 output, then
    y = y[:T] + y[T:] rounded to x's dtype once. The rows go in dequantized (two_term_rows): each
    row's largest value is 448 * its scale, so fp8_linear's per-token quantization, on whichever
    path it runs, finds the same scale (to an fp32 ulp) and gives back the same e4m3 codes; so
    every GEMM path serves two-term activations unchanged."""
    if input_scale is not None:
        raise ValueError("fp8_linear: two_term needs dynamic (per-token) activation scales, not a static input_scale")
    tokens = x.shape[0]
    if fp8_linear_path(x.device, 2 * tokens, w_q.shape, triton is not None) == "reference":
        # No FP8 GEMM to feed codes to: the two terms are summed first and multiplied once, the
        # two-GEMM product to within fp32 rounding (2^-24, against the terms' own ~2^-8) at half its
        # FLOPs (prefill on a CPU is FLOP bound).
        rows = two_term_rows(x)
        return dequantized_fp8_mm(rows[:tokens] + rows[tokens:], w_q, w_scale, x.dtype)
    if x.device.type == "cuda" and triton is not None:
        rows = triton.two_term_rows(x.contiguous())  # one launch instead of about a dozen torch ops
    else:
        rows = two_term_rows(x)
    out = fp8_linear(rows, w_q, w_scale, triton=triton)  # [2T, out] fp32
    return (out[:tokens] + out[tokens:]).to(x.dtype)


def two_term_rows(x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [2T, in] fp32
    """The two terms of quantize_per_token_two_term, dequantized: rows 0..T-1 are x_q1 * s1, rows T..2T-1
    x_q2 * s2 (their sum approximates x with ~2^-4 of the one-term error)."""
    x_q, x_scale = quantize_per_token_two_term(x)
    return x_q.float().mul_(x_scale)


def fp8_linear_path(device: torch.device, tokens: int, weight_shape: torch.Size, triton: bool) -> str:
    """Which implementation fp8_linear runs, `triton` telling whether it was given the Triton kernels:
    "triton_small_m" (decode-sized batches), "triton_quant_scaled_mm" (larger ones), "scaled_mm"
    (CUDA with FP8 GEMMs but no Triton), or "reference" (the CPU, devices without FP8 GEMMs, and
    weights _scaled_mm refuses at large M)."""
    if device.type != "cuda" or not fp8_gemm_available(device.index):
        return "reference"
    if triton and tokens <= SMALL_M_THRESHOLD:
        return "triton_small_m"  # masks every edge: any N and K
    out_features, in_features = weight_shape
    if out_features % SCALED_MM_ALIGNMENT or in_features % SCALED_MM_ALIGNMENT:
        return "reference"
    return "triton_quant_scaled_mm" if triton else "scaled_mm"


def _scaled_mm_rowwise(
    x_q: torch.Tensor,  # [T, K] float8, row-major
    x_scale: torch.Tensor,  # [T, 1] fp32
    w_q: torch.Tensor,  # [N, K] float8, row-major, so w_q.t() is the column-major [K, N] _scaled_mm needs
    w_scale: torch.Tensor,  # [N, 1] fp32; .t() is the [1, N] row-wise layout of scale_b
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [T, N]
    return torch._scaled_mm(x_q.contiguous(), w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=out_dtype)


@functools.lru_cache(maxsize=None)
def fp8_gemm_available(device_index: int | None) -> bool:
    """Whether this CUDA device has e4m3fn FP8 GEMMs: NVIDIA (not ROCm) at compute capability >= 8.9.

    Cached: the answer is a property of the hardware, and it is asked once per linear per step.
    """
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index) >= (8, 9)
