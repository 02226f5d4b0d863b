"""FP8 W8A8 numerics: weight and token quantization and the FP8 linear against fp64 references, the
FP8 GEMM's error bound, two-term activations, and which kernel path runs where."""
from __future__ import annotations

import pytest
import torch

from fp8_references import (GRID, HALF_ULP, SUBNORMAL_HALF_STEP, assert_equal_but_near_ties, fake_quantize_rows_fp64,
                            round_to_e4m3, rows_of_many_magnitudes)
from loraloom.engine.model.fp8 import Fp8Linear
from loraloom.kernels import fp8 as fp8_module
from loraloom.kernels.backend import get_backend
from loraloom.kernels.dtypes import FP8_MAX, quantize_with_scale
from loraloom.kernels.fp8 import (
    SMALL_M_THRESHOLD,
    fp8_gemm_available,
    fp8_linear,
    quantize_per_token,
    quantize_per_token_two_term,
    quantize_weight_per_channel,
)
from loraloom.kernels.reference import fp8_scaled_mm


# ----------------------------------------------------------------------------- quantization numerics


def test_e4m3_grid_is_torchs_float8_e4m3fn():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    finite = codes[torch.isfinite(codes) & (codes >= 0)].unique()  # +0 and -0 are one value
    assert torch.equal(finite, GRID) and GRID[-1] == FP8_MAX


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_and_token_quantization_equal_fp64_reference(dtype):
    weight = rows_of_many_magnitudes(96, 80, seed=1, dtype=dtype)
    weight[5] = 0  # an all-zero output channel
    x = rows_of_many_magnitudes(33, 80, seed=2, dtype=dtype)
    for quantize, tensor in ((quantize_weight_per_channel, weight), (quantize_per_token, x)):
        values, scale = quantize(tensor)
        _, expected_scale = fake_quantize_rows_fp64(tensor)
        assert values.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == (tensor.shape[0], 1)
        torch.testing.assert_close(scale.double(), expected_scale, rtol=2.0 ** -23, atol=0)
        assert_equal_but_near_ties(values, tensor.double() / expected_scale)
        # Each row's largest magnitude lands on the top of the range: the scale wastes no codes.
        nonzero = tensor.abs().amax(dim=-1) > 0
        assert torch.equal(values.double().abs().amax(dim=-1)[nonzero], torch.full((int(nonzero.sum()),), FP8_MAX,
                                                                                   dtype=torch.float64))


def test_rounding_ties_go_to_the_even_code_and_large_values_saturate():
    scale = torch.ones(1, 1)
    # 1.0625 lies halfway between 1.0 and 1.125, 1.1875 halfway between 1.125 and 1.25.
    x = torch.tensor([[1.0625, 1.1875, -1.0625, 500.0, -1e9, 2.0 ** -10, 3 * 2.0 ** -10]])
    expected = torch.tensor([[1.0, 1.25, -1.0, 448.0, -448.0, 0.0, 2.0 ** -8]], dtype=torch.float64)
    assert torch.equal(quantize_with_scale(x, scale).double(), expected)
    assert torch.equal(round_to_e4m3(x.double()), expected)  # the fp64 reference agrees on the corner cases


def dequantized_fp64(values_and_scale: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    values, scale = values_and_scale
    return values.double() * scale.double()


def test_fp8_linear_equals_fp64_matmul_of_the_same_quantization():
    x = rows_of_many_magnitudes(17, 64, seed=3)
    weight = rows_of_many_magnitudes(48, 64, seed=4)
    expected = dequantized_fp64(fake_quantize_rows_fp64(x)) @ dequantized_fp64(fake_quantize_rows_fp64(weight)).T
    out = fp8_linear(x, *quantize_weight_per_channel(weight))
    assert out.dtype == torch.float32 and out.shape == (17, 48)
    # Only the fp32 summation differs from fp64: bound it by the sum of magnitudes.
    magnitude = dequantized_fp64(fake_quantize_rows_fp64(x)).abs() @ dequantized_fp64(
        fake_quantize_rows_fp64(weight)).abs().T
    assert ((out.double() - expected).abs() <= 1e-6 * magnitude).all()


def test_fp8_gemm_error_is_within_the_e4m3_bound():
    x = rows_of_many_magnitudes(40, 128, seed=5)
    weight = rows_of_many_magnitudes(72, 128, seed=6)
    exact = x.double() @ weight.double().T  # [T, N]
    out = fp8_linear(x, *quantize_weight_per_channel(weight)).double()

    # Worst case per element: |x_q - x| <= max(2^-4 |x|, 2^-10 s_x), likewise for w; the product's
    # error is |x_q| |w_q - w| + |x_q - x| |w|, summed over k; plus fp32 summation.
    x_scale = x.double().abs().amax(dim=-1, keepdim=True) / FP8_MAX  # [T, 1]
    w_scale = weight.double().abs().amax(dim=-1, keepdim=True) / FP8_MAX  # [N, 1]
    x_error = torch.maximum(HALF_ULP * x.double().abs(), SUBNORMAL_HALF_STEP * x_scale)
    w_error = torch.maximum(HALF_ULP * weight.double().abs(), SUBNORMAL_HALF_STEP * w_scale)
    bound = (x.double().abs() + x_error) @ w_error.T + x_error @ weight.double().abs().T
    bound += 1e-6 * (x.double().abs() @ weight.double().abs().T)
    assert ((out - exact).abs() <= bound).all()

    # Per-token and per-channel scales keep each output's error at e4m3's level relative to its own
    # token's and channel's magnitudes, however small those are; one scale for the whole weight or
    # the whole batch would zero the small rows (relative errors above 0.2 on this data).
    relative = (out - exact).abs() / (x.double().norm(dim=-1, keepdim=True) @ weight.double().norm(dim=-1)[None])
    assert relative.max() < 0.03 and relative.mean() > 1e-4  # and the values really were quantized


def test_two_term_quantization_is_the_first_term_plus_the_quantized_residual():
    x = rows_of_many_magnitudes(21, 96, seed=17, dtype=torch.bfloat16)
    x[4] = 0  # a zero token: both terms zero, no NaN
    x_q, x_scale = quantize_per_token_two_term(x)
    assert x_q.dtype == torch.float8_e4m3fn and x_q.shape == (42, 96) and x_scale.shape == (42, 1)
    first_q, first_scale = quantize_per_token(x)
    assert torch.equal(x_q[:21].view(torch.uint8), first_q.view(torch.uint8)) and torch.equal(x_scale[:21], first_scale)
    # The second term is the per-token quantization of the residual as fp32 computes it (x - q1 * s1,
    # the product rounded to fp32 first: within 2^-24 of x of the exact residual).
    residual = x.float() - first_q.float() * first_scale
    _, residual_scale = fake_quantize_rows_fp64(residual)
    torch.testing.assert_close(x_scale[21:].double(), residual_scale, rtol=2.0 ** -23, atol=0)
    assert_equal_but_near_ties(x_q[21:], residual.double() / x_scale[21:].double())
    # The sum carries e4m3's rounding of the residual only: 2^-4 of 2^-4 of each value (plus subnormals),
    # against one term's 2^-4.
    approx = first_q.double() * first_scale.double() + x_q[21:].double() * x_scale[21:].double()
    error = (approx - x.double()).abs()
    # (A value in the first term's subnormals leaves a residual up to 2^-10 s1, rounded to 2^-4 of that.)
    bound = ((HALF_ULP ** 2 + 2.0 ** -22) * x.double().abs() + HALF_ULP * SUBNORMAL_HALF_STEP * first_scale.double()
             + SUBNORMAL_HALF_STEP * x_scale[21:].double())
    assert (error <= bound).all()
    one_term_error = (first_q.double() * first_scale.double() - x.double()).abs()
    assert error.sum() < one_term_error.sum() / 8
    assert torch.isfinite(approx).all() and not approx[4].any()


def test_two_term_fp8_linear_equals_fp64_matmul_and_cuts_the_activation_error():
    x = rows_of_many_magnitudes(19, 128, seed=18, dtype=torch.bfloat16)
    weight = rows_of_many_magnitudes(40, 128, seed=19)
    w_q, w_scale = quantize_weight_per_channel(weight)
    w_deq = w_q.double() * w_scale.double()
    x_q, x_scale = quantize_per_token_two_term(x)
    x_deq = x_q[:19].double() * x_scale[:19].double() + x_q[19:].double() * x_scale[19:].double()
    out = fp8_linear(x, w_q, w_scale, two_term=True)
    assert out.dtype == torch.bfloat16 and out.shape == (19, 40)
    expected = x_deq @ w_deq.T
    # The two halves are added in fp32 and rounded to bf16 once: within one bf16 rounding (plus fp32 sums).
    magnitude = x.double().abs() @ w_deq.abs().T
    assert ((out.double() - expected).abs() <= 2.0 ** -8 * expected.abs() + 1e-6 * magnitude).all()
    # Against the weights' own product (the activations' error only), two terms beat one by far.
    exact = x.double() @ w_deq.T
    one_term = fp8_linear(x.float(), w_q, w_scale).double()
    two_term = fp8_linear(x.float(), w_q, w_scale, two_term=True).double()
    assert (two_term - exact).norm() < (one_term - exact).norm() / 8
    with pytest.raises(ValueError, match="two_term needs dynamic"):
        fp8_linear(x, w_q, w_scale, torch.tensor([0.1]), two_term=True)
    with pytest.raises(ValueError, match="two-term activations are quantized per token"):
        Fp8Linear(128, (40,), static_input_scale=True, device="cpu", two_term_activations=True)


def test_zero_rows_and_columns_give_zeros_not_nan():
    x = rows_of_many_magnitudes(6, 32, seed=7)
    weight = rows_of_many_magnitudes(16, 32, seed=8)
    x[2] = 0  # a zero token
    weight[3] = 0  # a zero output channel
    weight[:, 7] = 0  # a zero input column
    out = fp8_linear(x, *quantize_weight_per_channel(weight))
    assert torch.isfinite(out).all()
    assert not out[2].any() and not out[:, 3].any()
    assert not fp8_linear(torch.zeros(3, 32), *quantize_weight_per_channel(torch.zeros(16, 32))).any()


def test_static_input_scale_clips_at_its_range():
    x = rows_of_many_magnitudes(9, 64, seed=9) * 0.01
    weight = rows_of_many_magnitudes(32, 64, seed=10)
    input_scale = torch.tensor([0.02])  # a calibrated scale that some of these activations exceed 448x of
    assert (x.abs() > FP8_MAX * input_scale).any()
    x_dequantized = round_to_e4m3(x.double() / 0.02) * 0.02
    weight_dequantized = dequantized_fp64(fake_quantize_rows_fp64(weight))
    expected = x_dequantized @ weight_dequantized.T
    out = fp8_linear(x, *quantize_weight_per_channel(weight), input_scale=input_scale).double()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6 * expected.abs().max().item())


@pytest.mark.skipif(not (torch.cuda.is_available() and fp8_gemm_available(None)),
                    reason="needs a CUDA device with FP8 GEMMs (compute capability >= 8.9)")
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("tokens", [3, 37], ids=["small_m_kernel", "quant_kernel_and_scaled_mm"])
def test_fp8_linear_on_cuda_equals_the_reference(static, tokens):
    x = (torch.randn(tokens, 256, generator=torch.Generator().manual_seed(11)) * 3).to("cuda", torch.bfloat16)
    weight = rows_of_many_magnitudes(384, 256, seed=12).to("cuda", torch.bfloat16)
    w_q, w_scale = quantize_weight_per_channel(weight)
    input_scale = torch.tensor([0.03], device="cuda") if static else None
    out = get_backend("cuda").fp8_linear(x, w_q, w_scale, input_scale, False)
    if static:
        x_scale = input_scale.expand(tokens, 1).contiguous()
        x_q = quantize_with_scale(x, x_scale)
    else:
        x_q, x_scale = quantize_per_token(x)
    expected = fp8_scaled_mm(x_q, x_scale, w_q, w_scale, torch.float32)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=2.0 ** -7, atol=1e-3 * expected.abs().max().item())

@pytest.mark.skipif(not (torch.cuda.is_available() and fp8_gemm_available(None)),
                    reason="needs a CUDA device with FP8 GEMMs (compute capability >= 8.9)")
@pytest.mark.parametrize("tokens", [3, 37], ids=["small_m_kernel", "quant_kernel_and_scaled_mm"])
def test_two_term_fp8_linear_on_cuda_equals_the_cpu_reference(tokens):
    x = (torch.randn(tokens, 256, generator=torch.Generator().manual_seed(11)) * 3).to(torch.bfloat16)
    weight = rows_of_many_magnitudes(384, 256, seed=12).to(torch.bfloat16)
    w_q, w_scale = quantize_weight_per_channel(weight)
    expected = fp8_linear(x, w_q, w_scale, two_term=True).float()  # the CPU reference path
    out = get_backend("cuda").fp8_linear(x.cuda(), w_q.cuda(), w_scale.cuda(), None, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().cpu(), expected, rtol=2.0 ** -7, atol=1e-3 * expected.abs().max().item())


def test_fp8_linear_picks_triton_on_fp8_cuda_devices_and_the_reference_elsewhere(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    square = torch.Size([4096, 4096])
    assert fp8_module.fp8_linear_path(cpu, 1, square, triton=True) == "reference"
    monkeypatch.setattr(fp8_module, "fp8_gemm_available", lambda index: False)  # e.g. an A100
    assert fp8_module.fp8_linear_path(cuda, 1, square, triton=True) == "reference"
    monkeypatch.setattr(fp8_module, "fp8_gemm_available", lambda index: True)  # an H100
    assert fp8_module.fp8_linear_path(cuda, 1, square, triton=True) == "triton_small_m"
    assert fp8_module.fp8_linear_path(cuda, SMALL_M_THRESHOLD, torch.Size([100, 72]), triton=True) == "triton_small_m"
    assert fp8_module.fp8_linear_path(cuda, SMALL_M_THRESHOLD + 1, square, triton=True) == "triton_quant_scaled_mm"
    # _scaled_mm refuses N and K that are not multiples of 16.
    assert fp8_module.fp8_linear_path(cuda, 512, torch.Size([100, 72]), triton=True) == "reference"
    # A backend without the Triton kernels (CUDA without Triton installed).
    assert fp8_module.fp8_linear_path(cuda, 1, square, triton=False) == "scaled_mm"
    assert fp8_module.fp8_linear_path(cuda, 512, torch.Size([100, 72]), triton=False) == "reference"
