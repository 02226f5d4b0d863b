"""kernels/fp8_gemm.py under the Triton interpreter: the small-M FP8 GEMM against the dequantizing
reference kernels/reference.py, on ragged shapes, static scales and every launch configuration."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels.dtypes import quantize_with_scale
from loraloom.kernels.fp8 import SMALL_M_THRESHOLD, quantize_per_token, quantize_weight_per_channel
from loraloom.kernels.fp8_gemm import SmallMConfig, auto_split_k, default_config, fp8_linear_small_m
from loraloom.kernels.reference import fp8_scaled_mm


def reference_linear(x, w_q, w_scale, input_scale=None) -> torch.Tensor:
    if input_scale is None:
        x_q, x_scale = quantize_per_token(x)
    else:
        x_scale = input_scale.reshape(1, 1).expand(x.shape[0], 1).contiguous()
        x_q = quantize_with_scale(x, x_scale)
    return fp8_scaled_mm(x_q, x_scale, w_q, w_scale, torch.float32)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected).abs().max() / expected.abs().max())


# Ragged shapes: N and K not multiples of any block, K splits whose last one is short.
CONFIGS = [SmallMConfig(block_n=32, block_k=32, split_k=1, num_warps=4, num_stages=1),
           SmallMConfig(block_n=16, block_k=64, split_k=3, num_warps=4, num_stages=1),
           SmallMConfig(block_n=16, block_k=64, split_k=3, num_warps=4, num_stages=1, fuse_quant=False)]
CONFIG_IDS = ["one_launch", "split_k", "quant_kernel_first"]


@pytest.mark.parametrize("tokens", [1, 5, SMALL_M_THRESHOLD])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_small_m_gemm_equals_the_reference(tokens, config, dtype):
    g = torch.Generator().manual_seed(tokens)
    n, k = 70, 200
    x = (torch.randn(tokens, k, generator=g) * 10.0 ** torch.empty(tokens, 1).uniform_(-2, 2, generator=g)).to(dtype)
    w_q, w_scale = quantize_weight_per_channel(torch.randn(n, k, generator=g) * 0.05)
    out = fp8_linear_small_m(x, w_q, w_scale, config=config)
    assert out.dtype == dtype and out.shape == (tokens, n)
    # Products of e4m3 values are exact in fp32: only the summation order and the output rounding differ.
    tolerance = 1e-5 if dtype == torch.float32 else 1e-3
    assert relative_error(out, reference_linear(x, w_q, w_scale)) <= tolerance


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_small_m_gemm_with_a_static_input_scale(config):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 96, generator=g) * 4  # some values beyond 448 * 0.02: they must saturate
    w_q, w_scale = quantize_weight_per_channel(torch.randn(40, 96, generator=g))
    static = torch.tensor([0.02])
    out = fp8_linear_small_m(x, w_q, w_scale, static, config)
    assert relative_error(out, reference_linear(x, w_q, w_scale, static)) <= 1e-5


def test_small_m_gemm_keeps_rows_independent_and_zero_rows_zero():
    """Per-token scales: a row's output does not depend on its batch-mates; an all-zero row gives zeros."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 64, generator=g)
    x[1] = 0
    x[2] *= 1e4
    w_q, w_scale = quantize_weight_per_channel(torch.randn(48, 64, generator=g))
    config = CONFIGS[1]
    batch = fp8_linear_small_m(x, w_q, w_scale, config=config)
    alone = torch.cat([fp8_linear_small_m(x[i:i + 1], w_q, w_scale, config=config) for i in range(4)])
    assert torch.equal(batch, alone)
    assert torch.equal(batch[1], torch.zeros(48))


def test_small_m_gemm_accepts_a_strided_activation_view():
    g = torch.Generator().manual_seed(9)
    wide = torch.randn(2, 160, generator=g)
    x = wide[:, 32:96]  # row stride 160, as a slice of a fused projection's output would be
    w_q, w_scale = quantize_weight_per_channel(torch.randn(24, 64, generator=g))
    out = fp8_linear_small_m(x, w_q, w_scale, config=CONFIGS[0])
    assert relative_error(out, reference_linear(x.contiguous(), w_q, w_scale)) <= 1e-5


def test_default_config_splits_k_only_for_narrow_outputs():
    """Llama-3.1-8B: o_proj (N 4096) needs splits to fill 132 SMs; gate_up (N 28672) fills them alone."""
    assert default_config(4096, 4096).split_k > 1
    assert default_config(28672, 4096).split_k == 1
    assert auto_split_k(64, 128, block_n=64, block_k=64) == 2  # never more splits than K steps
    # One token: quantized inside the GEMM (one launch); more: quantized once, by its own kernel.
    assert default_config(4096, 4096, m=1).fuse_quant and not default_config(4096, 4096, m=16).fuse_quant


@pytest.mark.parametrize("field, value", [("block_n", 48), ("block_k", 8), ("split_k", 0)])
def test_config_rejects_impossible_values_by_name(field, value):
    fields = dict(block_n=32, block_k=32, split_k=1, num_warps=4, num_stages=1)
    fields[field] = value
    with pytest.raises(ValueError, match=field):
        SmallMConfig(**fields)
