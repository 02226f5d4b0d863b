"""Fused RMSNorm kernels: one launch per norm instead of the ~8 small ops of the torch version.

A decode step of Llama-3.1-8B runs 65 norms; in eager torch each is a cast, square, mean, add,
rsqrt, multiply, cast and multiply (plus the residual add before it), so norms alone were
hundreds of launches per step. Here one program normalizes one row of `hidden` elements held
in registers (4096 for Llama-3.1-8B), with the numerics of kernels/reference.py:

    out = weight * (x32 * rsqrt(mean(x32^2) + eps)).to(dtype),   x32 = x in fp32

fused_add_rms_norm also folds in the residual add that precedes every norm but the first:
new_residual = (x + residual) rounded to the dtype, as torch's add rounds it, then normed; each
input is read once and each output written once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr,  # x, residual: [T, hidden]; weight: [hidden]
    out_ptr, new_residual_ptr,  # [T, hidden]
    hidden, eps,
    stride_x, stride_r, stride_o, stride_nr,
    ADD_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # Rounded to the dtype before the norm reads it: the stored residual is what torch's
        # `hidden + out` would hold, and the norm of it matches the unfused model bit for bit.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    # The mean of squares in fp32: in bf16 it loses the small components of large-norm rows.
    mean_square = tl.sum(x32 * x32, axis=0) / hidden
    normed = (x32 * tl.math.rsqrt(mean_square + eps)).to(x_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    # Two values of the dtype multiply exactly in fp32, so one rounding gives torch's product.
    out = weight.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _check(name: str, tensor: torch.Tensor, weight: torch.Tensor) -> None:
    hidden = weight.shape[0]
    assert weight.dim() == 1 and weight.stride(0) == 1, f"weight must be a contiguous [hidden]; got {tuple(weight.shape)}"
    assert tensor.dim() == 2 and tensor.shape[1] == hidden and tensor.stride(1) == 1, (
        f"{name} must be [T, hidden={hidden}] with contiguous rows; got {tuple(tensor.shape)} strides {tensor.stride()}")
    assert tensor.dtype == weight.dtype, (
        f"{name} dtype {tensor.dtype} differs from weight's {weight.dtype}; cast one (the model keeps both in its dtype)")


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            out: torch.Tensor, new_residual: torch.Tensor | None) -> None:
    num_rows, hidden = x.shape
    if num_rows == 0:
        return
    block = triton.next_power_of_2(hidden)
    add = residual is not None
    _rms_norm_kernel[(num_rows,)](
        x, residual if add else x, weight, out, new_residual if add else out,
        hidden, eps,
        x.stride(0), residual.stride(0) if add else 0, out.stride(0), new_residual.stride(0) if add else 0,
        ADD_RESIDUAL=add, BLOCK=block,
        num_warps=max(1, min(16, block // 512)),  # ~16 elements per thread
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, hidden] -> weight * rmsnorm(x), [T, hidden] in x's dtype."""
    _check("x", x, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, None, weight, eps, out, None)
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, residual) [T, hidden] -> (weight * rmsnorm(x + residual), x + residual)."""
    _check("x", x, weight)
    _check("residual", residual, weight)
    assert residual.shape == x.shape, f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}"
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, residual, weight, eps, out, new_residual)
    return out, new_residual
