"""kernels/fp8_quant.py under the Triton interpreter: per-token FP8 quantization and the two-term
rows, bit for bit against kernels/fp8.py and kernels/dtypes.py's rounding rule."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels.dtypes import FP8_DTYPE, quantize_with_scale
from loraloom.kernels.fp8 import quantize_per_token, two_term_rows
from loraloom.kernels.fp8_quant import quantize_per_token_triton, two_term_rows_triton


def codes(x_q: torch.Tensor) -> torch.Tensor:
    """The raw e4m3 bytes: equal codes, not just equal values (so -0 vs +0 counts)."""
    return x_q.view(torch.uint8)


def hard_rows(dtype: torch.dtype) -> torch.Tensor:
    """Rows over six decades plus an all-zero row, signed zeros, huge and tiny values; K = 1100 is
    not a multiple of the kernel's block, so the masked tail is exercised."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 1100, generator=g) * 10.0 ** torch.empty(7, 1).uniform_(-3, 3, generator=g)
    x[0] = 0
    x[1, :6] = torch.tensor([-0.0, 1e-30, -1e-30, 5e-8, 6e4, -6e4])  # 6e4: near fp16's top
    x[2] = torch.rand(1100, generator=g) * 2.0 ** -14  # everything tiny: still mapped up to 448
    x[3, 10] = 1e4  # one outlier pushes the rest of the row into e4m3 subnormals
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_kernel_equals_quantize_per_token_bitwise(dtype):
    x = hard_rows(dtype)
    x_q, scale = quantize_per_token_triton(x)
    expected_q, expected_scale = quantize_per_token(x)
    assert x_q.dtype == FP8_DTYPE and scale.shape == (7, 1)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes(x_q), codes(expected_q))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_two_term_kernel_equals_two_term_rows_bitwise(dtype):
    x = hard_rows(dtype)
    rows = two_term_rows_triton(x)
    assert rows.shape == (14, 1100) and rows.dtype == torch.float32
    assert torch.equal(rows, two_term_rows(x))
    # The second term is the first one's rounding error, so the pair is ~16x closer to x than the first alone.
    x64 = x.double()
    one_term, pair = (rows[:7].double() - x64).norm(), (rows[:7].double() + rows[7:].double() - x64).norm()
    assert pair * 8 < one_term


def test_quantize_kernel_with_a_static_scale_equals_quantize_with_scale():
    x = hard_rows(torch.bfloat16)
    static = torch.tensor([0.37])
    x_q, scale = quantize_per_token_triton(x, static)
    expected_scale = static.reshape(1, 1).expand(7, 1).contiguous()
    assert torch.equal(scale, expected_scale)  # the [T, 1] layout row-wise _scaled_mm takes
    assert torch.equal(codes(x_q), codes(quantize_with_scale(x, expected_scale)))  # saturates at +-448 too


def test_quantize_kernel_rounds_every_midpoint_to_the_even_code():
    """Each e4m3 value, each midpoint between neighbours (a tie), and the fp32 numbers just either
    side of each midpoint; with scale 1 these are the values the rounding sees."""
    every_code = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()
    grid = every_code[torch.isfinite(every_code)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([grid, mids, mids.nextafter(torch.tensor(1e9)), mids.nextafter(torch.tensor(-1e9))])
    values = values.reshape(1, -1)
    x_q, _ = quantize_per_token_triton(values, torch.ones(1))
    assert torch.equal(codes(x_q), codes(quantize_with_scale(values, torch.ones(1, 1))))
