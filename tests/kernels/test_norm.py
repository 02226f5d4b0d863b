"""Triton rms_norm and fused_add_rms_norm (interpreted on the CPU) against kernels/reference.py."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import norm, reference

EPS = 1e-5


def rows(tokens: int, hidden: int, dtype: torch.dtype, seed: int, exact_squares: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if exact_squares:
        # Multiples of 1/8 below 4: every square and partial sum is exact in fp32, so the result
        # cannot depend on the order of the reduction and must equal the reference bit for bit.
        return (torch.randint(-32, 32, (tokens, hidden), generator=generator) / 8).to(dtype)
    # Rows of very different scales: the mean of squares must not be taken in the dtype.
    scales = torch.logspace(-2, 2, tokens)[:, None]
    return (torch.randn(tokens, hidden, generator=generator) * scales).to(dtype)


def weight(hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 100)
    return (1 + 0.5 * torch.randn(hidden, generator=generator)).to(dtype)


# One ulp of the dtype near 1: the reduction order and rsqrt may differ in the last bit of the
# fp32 scale, which can flip one rounding of the output.
TOLERANCES = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.float16: dict(atol=1e-3, rtol=1e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [64, 96])
def test_rms_norm_is_exact_when_the_sum_is(hidden: int, dtype: torch.dtype) -> None:
    x, w = rows(5, hidden, dtype, 0, exact_squares=True), weight(hidden, dtype, 0)

    assert torch.equal(norm.rms_norm(x, w, EPS), reference.rms_norm(x, w, EPS))


def test_fused_add_rms_norm_is_exact_in_fp32_when_the_sum_is() -> None:
    x, residual = rows(5, 64, torch.float32, 1, exact_squares=True), rows(5, 64, torch.float32, 2, exact_squares=True)
    w = weight(64, torch.float32, 1)

    normed, new_residual = norm.fused_add_rms_norm(x, residual, w, EPS)

    expected_normed, expected_residual = reference.fused_add_rms_norm(x, residual, w, EPS)
    assert torch.equal(new_residual, expected_residual)
    assert torch.equal(normed, expected_normed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [32, 100])  # 100: the power-of-two tile is masked
def test_rms_norm_matches_reference(hidden: int, dtype: torch.dtype) -> None:
    x, w = rows(7, hidden, dtype, 3), weight(hidden, dtype, 3)

    out = norm.rms_norm(x, w, EPS)

    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, reference.rms_norm(x, w, EPS), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_add_rms_norm_matches_reference(dtype: torch.dtype) -> None:
    x, residual, w = rows(6, 80, dtype, 4), rows(6, 80, dtype, 5), weight(80, dtype, 4)

    normed, new_residual = norm.fused_add_rms_norm(x, residual, w, EPS)

    expected_normed, expected_residual = reference.fused_add_rms_norm(x, residual, w, EPS)
    assert torch.equal(new_residual, expected_residual)  # one rounded add: exact in any dtype
    torch.testing.assert_close(normed, expected_normed, **TOLERANCES[dtype])


def test_rows_with_a_stride_and_inputs_left_untouched() -> None:
    """A view into a wider buffer (e.g. a slice of a fused output) is read by its row stride."""
    wide = rows(4, 128, torch.float32, 6)
    x, residual = wide[:, :64], wide[:, 64:]
    before = wide.clone()
    w = weight(64, torch.float32, 6)

    normed, new_residual = norm.fused_add_rms_norm(x, residual, w, EPS)

    expected_normed, expected_residual = reference.fused_add_rms_norm(x, residual, w, EPS)
    torch.testing.assert_close(normed, expected_normed, **TOLERANCES[torch.float32])
    assert torch.equal(new_residual, expected_residual)
    assert torch.equal(wide, before)


def test_empty_batch_and_dtype_mismatch() -> None:
    w = weight(32, torch.float32, 7)
    assert norm.rms_norm(torch.zeros(0, 32), w, EPS).shape == (0, 32)
    with pytest.raises(AssertionError, match="dtype"):
        norm.rms_norm(torch.zeros(2, 32, dtype=torch.float16), w, EPS)
