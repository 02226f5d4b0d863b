"""The FP8 KV cache's numerics (kernels/kv_quant.py) against their definitions.

The e4m3 grid is enumerated from its 8-bit codes, so "nearest value" and "ties to even" are
checked against the format itself, not against another cast.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels.dtypes import FP8_DTYPE, FP8_MAX
from loraloom.kernels.kv_quant import (
    CALIBRATION_HEADROOM, check_kv_scales, dequantize_kv, quantize_kv, scale_for_amax,
)

# Codes 0x00..0x7E are the non-negative finite e4m3fn values in ascending order (0x7F is NaN).
POSITIVE_CODES = torch.arange(0, 0x7F, dtype=torch.uint8)
GRID = POSITIVE_CODES.view(FP8_DTYPE).double()  # 0, subnormals, normals up to 448
SCALE = torch.tensor([0.0375])  # not a power of two: the division by it rounds too


def round_trip(x: torch.Tensor, scale: torch.Tensor = SCALE) -> torch.Tensor:
    return dequantize_kv(quantize_kv(x, scale, FP8_DTYPE), scale, torch.float64)


def test_quantize_gives_the_nearest_e4m3_value() -> None:
    x = torch.linspace(-FP8_MAX, FP8_MAX, 20001, dtype=torch.float64) * SCALE.double() * 0.999
    stored = quantize_kv(x.float(), SCALE, FP8_DTYPE).double()
    scaled = x.float().double() / SCALE.double()
    nearest_distance = (scaled.abs()[:, None] - GRID[None, :]).abs().min(dim=1).values
    # fp32 division may move a value by an fp32 ulp: allow that much beyond the exact nearest distance.
    assert bool(((stored - scaled).abs() <= nearest_distance + scaled.abs() * 2.0 ** -23).all())


def test_ties_round_to_the_even_code() -> None:
    midpoints = (GRID[:-1] + GRID[1:]) / 2  # exactly representable in fp32: a tie after x / 1.0
    codes = quantize_kv(midpoints.float(), torch.tensor([1.0]), FP8_DTYPE).view(torch.uint8)
    assert bool((codes % 2 == 0).all())
    assert bool((codes - POSITIVE_CODES[:-1]).le(1).all())  # one of the two neighbours


def test_round_trip_error_is_within_half_an_e4m3_step() -> None:
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.logspace(-9, 8.7, 4000, base=2.0, dtype=torch.float64)  # down to subnormals, up to 416
    signs = torch.randint(0, 2, magnitudes.shape, generator=generator) * 2 - 1
    x = (magnitudes * signs * SCALE.double()).float()

    error = (round_trip(x) - x.double()).abs()

    # 3 mantissa bits: half a step is 2^-4 of the value for normals; subnormals step by 2^-9 * scale.
    bound = torch.maximum(x.double().abs() * 2.0 ** -4, torch.full_like(error, 2.0 ** -10 * SCALE.item()))
    assert bool((error <= bound * (1 + 2.0 ** -20)).all())


def test_values_beyond_the_range_saturate_at_448() -> None:
    x = torch.tensor([449.0, 1e4, 1e30, float("inf")]) * SCALE
    x = torch.cat([x, -x])

    stored = quantize_kv(x, SCALE, FP8_DTYPE).float()

    assert stored.tolist() == [FP8_MAX] * 4 + [-FP8_MAX] * 4  # not NaN, which e4m3fn has instead of inf


def test_dequantize_multiplies_by_the_fp32_scale_and_rounds_once() -> None:
    scale = torch.tensor([1 / 3])  # bfloat16(1/3) is 2^-9 off: a scale rounded to bf16 first shows
    stored = GRID.float().to(FP8_DTYPE)

    out = dequantize_kv(stored, scale, torch.bfloat16)

    exact = GRID * scale.double()  # 4 x 24 significant bits: exact in fp64
    assert out.dtype == torch.bfloat16
    assert bool(((out.double() - exact).abs() <= exact * 2.0 ** -8 * (1 + 2.0 ** -10)).all())  # half a bf16 ulp


def test_a_cache_in_the_activation_dtype_takes_no_scale() -> None:
    x = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(1))

    stored = quantize_kv(x, None, torch.bfloat16)

    assert stored.dtype == torch.bfloat16 and torch.equal(stored, x.to(torch.bfloat16))
    assert dequantize_kv(stored, None, torch.bfloat16) is stored


def test_calibrated_scale_keeps_headroom_and_never_divides_by_zero() -> None:
    amax = torch.tensor([3.0])
    scale = scale_for_amax(amax)

    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert quantize_kv(amax, scale, FP8_DTYPE).float().item() == FP8_MAX / CALIBRATION_HEADROOM
    assert quantize_kv(amax * CALIBRATION_HEADROOM, scale, FP8_DTYPE).float().item() == FP8_MAX  # the last fit
    zero_scale = scale_for_amax(torch.tensor([0.0]))
    assert zero_scale.item() > 0
    assert quantize_kv(torch.zeros(4), zero_scale, FP8_DTYPE).float().tolist() == [0.0] * 4


def test_check_kv_scales() -> None:
    fp8_cache = torch.zeros(2, 4, 1, 16, dtype=FP8_DTYPE)
    bf16_cache = torch.zeros(2, 4, 1, 16, dtype=torch.bfloat16)
    scale = torch.tensor([0.5])
    check_kv_scales(fp8_cache, scale, scale)
    check_kv_scales(bf16_cache, None, None)
    with pytest.raises(AssertionError, match="needs v_scale"):
        check_kv_scales(fp8_cache, scale, None)
    with pytest.raises(AssertionError, match=r"k_scale must be a \[1\] fp32 tensor"):
        check_kv_scales(fp8_cache, torch.tensor([0.5, 0.5]), scale)
    with pytest.raises(AssertionError, match=r"v_scale must be a \[1\] fp32 tensor"):
        check_kv_scales(fp8_cache, scale, scale.half())
    with pytest.raises(AssertionError, match="this cache is torch.bfloat16: pass None"):
        check_kv_scales(bf16_cache, scale, scale)
