"""FP8 W8A8: quantization numerics against fp64, the FP8 GEMM's error bound, perplexity of the
bundled model in FP8 against BF16, compressed-tensors FP8 checkpoints, and LoRA on an FP8 base."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora_factory import hf_base_model, make_peft_adapter
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.model.fp8 import BF16_LAYERS_AT_LOAD, TWO_TERM_ACTIVATIONS_AT_LOAD, Fp8Linear, quantize_model_fp8
from loraloom.engine.model.layers import Linear
from loraloom.engine.model.loader import checkpoint_files, load_model
from loraloom.engine.lora.layers import LoRALinear, LoRASlotPool, attach_lora, build_sgmv_metadata
from loraloom.engine.lora.weights import load_adapter_weights
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.engine.tokenizer import Tokenizer
from loraloom.kernels import fp8 as fp8_module
from loraloom.kernels.backend import get_backend
from loraloom.kernels.dtypes import FP8_MAX, MIN_AMAX, quantize_with_scale
from loraloom.kernels.fp8 import (
    SMALL_M_THRESHOLD,
    fp8_gemm_available,
    fp8_linear,
    quantize_per_token,
    quantize_per_token_two_term,
    quantize_weight_per_channel,
)
from loraloom.kernels.metadata import AttentionMetadata
from loraloom.kernels.reference import fp8_scaled_mm

HALF_ULP = 2.0 ** -4  # e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of itself
SUBNORMAL_HALF_STEP = 2.0 ** -10  # below 2^-6 the grid step is 2^-9 (in units of the scale)


# ----------------------------------------------------------------------------- fp64 references


def e4m3_grid() -> torch.Tensor:
    """Every non-negative finite float8_e4m3fn value, ascending, from the format's definition
    (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; exponent 15 with mantissa 7 is NaN)."""
    values = [m / 8 * 2.0 ** -6 for m in range(8)]  # subnormals, exponent field 0
    values += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if (e, m) != (15, 7)]
    return torch.tensor(values, dtype=torch.float64)


GRID = e4m3_grid()


def e4m3_neighbours(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 values saturated to +-448 -> (nearest e4m3 value with ties to the even code, the other
    of the two e4m3 values around v, whether v is so near their midpoint that fp32 arithmetic
    upstream of the rounding may land on either side). The grid index of a non-negative value is
    its 7-bit code, so "even code" is "even index"."""
    magnitude = v.abs().clamp(max=FP8_MAX)
    upper = torch.searchsorted(GRID, magnitude).clamp(1, len(GRID) - 1)  # GRID[upper - 1] <= magnitude <= GRID[upper]
    lower = upper - 1
    below, above = magnitude - GRID[lower], GRID[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    nearest = torch.where(pick_upper, GRID[upper], GRID[lower]) * v.sign()
    other = torch.where(pick_upper, GRID[lower], GRID[upper]) * v.sign()
    near_tie = (above - below).abs() <= 2.0 ** -20 * magnitude
    return nearest, other, near_tie


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    return e4m3_neighbours(v)[0]


def fake_quantize_rows_fp64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (the e4m3 values x / scale rounds to, scale [R, 1]), all in fp64."""
    x64 = x.double()
    scale = x64.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    return round_to_e4m3(x64 / scale), scale


def assert_equal_but_near_ties(values: torch.Tensor, exact_quotients: torch.Tensor) -> None:
    """e4m3 `values` equal the fp64 rounding of `exact_quotients`, except that within fp32 precision
    of a midpoint (the scale is an fp32 number) either neighbour is right."""
    nearest, other, near_tie = e4m3_neighbours(exact_quotients)
    values = values.double()
    assert torch.equal(values[~near_tie], nearest[~near_tie])
    assert ((values == nearest) | (values == other))[near_tie].all()


def rows_of_many_magnitudes(rows: int, cols: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random rows scaled over six decades, so one shared scale would push small rows into subnormals."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.empty(rows, 1).uniform_(-3, 3, generator=generator)
    return (torch.randn(rows, cols, generator=generator) * magnitudes).to(dtype)


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


# ----------------------------------------------------------------------------- perplexity

LICENSE_DIR = Path("/usr/share/common-licenses")  # shipped by Debian's base-files package, on every machine
PERPLEXITY_CHUNK = 1024
PERPLEXITY_CHUNKS = 20  # 20,480 tokens


def held_out_tokens(model_dir: Path) -> torch.Tensor:
    """The first PERPLEXITY_CHUNK * PERPLEXITY_CHUNKS tokens of the license texts (symlinks skipped: aliases)."""
    files = sorted(path for path in LICENSE_DIR.iterdir() if path.is_file() and not path.is_symlink())
    text = "\n\n".join(path.read_text() for path in files)
    ids = Tokenizer.from_dir(model_dir).encode(text, add_special_tokens=False)
    needed = PERPLEXITY_CHUNK * PERPLEXITY_CHUNKS
    assert len(ids) >= needed, f"{LICENSE_DIR} holds only {len(ids)} tokens, {needed} are needed"
    return torch.tensor(ids[:needed])


def single_sequence_metadata(length: int, block_size: int) -> AttentionMetadata:
    """One sequence of `length` new tokens in blocks 0, 1, 2, ... (a fresh cache: nothing before it)."""
    blocks = -(-length // block_size)
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, length], dtype=torch.int32),
        seq_lens=torch.tensor([length], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(length),
        query_start_loc_host=[0, length],
        seq_lens_host=[length],
    )


def perplexity(model, tokens: torch.Tensor, dtype: torch.dtype) -> float:
    """exp(mean next-token NLL) over independent chunks, each a fresh sequence from position 0."""
    block_size = 16
    kv_caches = allocate_kv_cache(model.config, PERPLEXITY_CHUNK // block_size, block_size, dtype, "cpu")
    attn = single_sequence_metadata(PERPLEXITY_CHUNK, block_size)
    positions = torch.arange(PERPLEXITY_CHUNK)
    total_nll, predicted = 0.0, 0
    with torch.inference_mode():
        for chunk in tokens.view(-1, PERPLEXITY_CHUNK):
            # Every position of the cache is rewritten before it is read: a fresh cache per chunk.
            logits = model.compute_logits(model(chunk, positions, kv_caches, attn, None))  # [chunk, vocab] fp32
            total_nll += torch.nn.functional.cross_entropy(logits[:-1], chunk[1:], reduction="sum").item()
            predicted += PERPLEXITY_CHUNK - 1
    return math.exp(total_nll / predicted)


# The issue asks for FP8 within 1% of BF16. Measured on these 20,480 tokens (bf16 16.024): the recipe of
# quantize_model_fp8 (two-term per-token activations, last decoder layer in BF16; engine/model/fp8.py
# BF16_LAYERS_AT_LOAD says why and what else was tried) x1.0001; before it, all layers one-term FP8
# x1.026, one-term with the last layer in BF16 x1.0126 (~0.4% of rounding noise between equivalent variants).
PERPLEXITY_RATIO_BOUND = 1.01


# About 4 minutes of `make test` on the 2-core machine: the quality bound is checked on every run.
def test_fp8_perplexity_within_one_percent_of_bf16(model_dir):
    # Both models run in bfloat16 (the reference, and on CPUs with bf16 instructions ~2x faster
    # than fp32 here); the FP8 one differs only in the projections quantize_model_fp8 converts, whose
    # GEMMs run in the reference's fp32 (kernels/reference.py fp8_scaled_mm), as on the GPU.
    tokens = held_out_tokens(model_dir)
    reference = perplexity(load_model(model_dir, torch.bfloat16, "cpu"), tokens, torch.bfloat16)
    fp8 = perplexity(load_model(model_dir, torch.bfloat16, "cpu", quantize_to_fp8=True), tokens, torch.bfloat16)
    report = (f"perplexity over {len(tokens)} tokens of {LICENSE_DIR}: bf16 {reference:.4f}, fp8 {fp8:.4f} "
              f"(x{fp8 / reference:.4f})")
    print(f"\n{report}")
    assert fp8 <= PERPLEXITY_RATIO_BOUND * reference, report


# ----------------------------------------------------------------------------- FP8 modules


def test_quantize_model_fp8_replaces_the_projections_only(tiny_llama_dir):
    original = load_model(tiny_llama_dir, torch.bfloat16, "cpu")
    backend = get_backend("cpu")
    model = load_model(tiny_llama_dir, torch.bfloat16, "cpu", backend, quantize_to_fp8=True)
    assert BF16_LAYERS_AT_LOAD == (-1,) and TWO_TERM_ACTIVATIONS_AT_LOAD
    for index, (before, after) in enumerate(zip(original.layers, model.layers)):
        for block, name in (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
                            ("mlp", "down_proj")):
            linear, fp8 = getattr(getattr(before, block), name), getattr(getattr(after, block), name)
            if index == len(model.layers) - 1:  # the last layer stays in the model dtype, unchanged
                assert type(fp8) is Linear and torch.equal(fp8.weight, linear.weight)
                continue
            assert type(fp8) is Fp8Linear and fp8.weight.dtype == torch.float8_e4m3fn and fp8.input_scale is None
            assert fp8.two_term_activations and fp8.backend is backend  # the model's kernels run its product
            assert (fp8.in_features, fp8.slice_sizes) == (linear.in_features, linear.slice_sizes)
            # Each weight moves by at most half an e4m3 step of its own channel's scale.
            weight = linear.weight.double()
            error = (fp8.weight.double() * fp8.weight_scale.double() - weight).abs()
            scale = weight.abs().amax(dim=-1, keepdim=True) / FP8_MAX
            assert (error <= torch.maximum(HALF_ULP * weight.abs(), SUBNORMAL_HALF_STEP * scale) * (1 + 1e-6)).all()
    assert type(model.lm_head) is Linear and model.lm_head.weight.dtype == torch.bfloat16
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"layers\[0\]\.self_attn\.qkv_proj is a Fp8Linear"):
        quantize_model_fp8(model)


@pytest.mark.parametrize(("bf16_layers", "fp8_layers"), [((), [0, 1]), ((0,), [1]), ((0, -1), [])])
def test_quantize_model_fp8_keeps_the_chosen_layers_in_the_model_dtype(tiny_llama_dir, bf16_layers, fp8_layers):
    model = load_model(tiny_llama_dir, torch.bfloat16, "cpu")
    quantize_model_fp8(model, bf16_layers=bf16_layers)
    quantized = [i for i, layer in enumerate(model.layers) if type(layer.mlp.down_proj) is Fp8Linear]
    assert quantized == fp8_layers
    with pytest.raises(ValueError, match=r"bf16_layers holds layer 2, but the model has 2 layers"):
        quantize_model_fp8(load_model(tiny_llama_dir, torch.bfloat16, "cpu"), bf16_layers=(2,))


def test_engine_config_refuses_unknown_quantization():
    assert EngineConfig(quantization="fp8").quantization == "fp8"
    with pytest.raises(ValueError, match=r"EngineConfig\.quantization is 'int8'"):
        EngineConfig(quantization="int8")
    with pytest.raises(ValueError, match=r"EngineConfig\.fp8_activation_terms is 3; use one of \[1, 2\]"):
        EngineConfig(quantization="fp8", fp8_activation_terms=3)


# ----------------------------------------------------------------------------- compressed-tensors checkpoints


def quantization_config(weight_strategy: str, static_activations: bool) -> dict:
    """config.json quantization_config as llm-compressor writes it for an FP8 W8A8 export."""
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None,
           "actorder": None, "dynamic": False, "observer": "minmax", "observer_kwargs": {}}
    activations = ({**fp8, "strategy": "tensor"} if static_activations
                   else {**fp8, "strategy": "token", "dynamic": True, "observer": None})
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {**fp8, "strategy": weight_strategy},
            "input_activations": activations,
            "output_activations": None,
        }},
    }


def calibrated_input_scales(source: Path, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Static activation scales as a minmax observer calibrates them: per *_proj module of the Hugging Face
    model, max |input| over `tokens` / 448, widened by a random factor in [1, 1.5) so that the modules
    fused into one projection disagree (and the loader must pick the widest)."""
    model = hf_base_model(source)
    amax: dict[str, float] = {}
    hooks = [
        module.register_forward_hook(
            lambda _module, inputs, _output, name=name: amax.__setitem__(name, inputs[0].abs().max().item()))
        for name, module in model.named_modules() if name.endswith("_proj")
    ]
    with torch.no_grad():
        model(tokens[None])
    for hook in hooks:
        hook.remove()
    generator = torch.Generator().manual_seed(13)
    return {name: torch.tensor([value / FP8_MAX]) * (1 + 0.5 * torch.rand(1, generator=generator))
            for name, value in sorted(amax.items())}


def write_fp8_checkpoint(source: Path, destination: Path, weight_strategy: str,
                         input_scales: dict[str, torch.Tensor] | None, scale_dtype: torch.dtype) -> Path:
    """`source` (a Hugging Face Llama checkpoint) exported as compressed-tensors FP8: every *_proj weight,
    cast to bf16 first like a BF16 checkpoint, in float8_e4m3fn with its weight_scale, and with
    `input_scales` (per module name) as static activation scales, or dynamic activations if None."""
    tensors = {}
    for path in checkpoint_files(source):
        tensors.update(load_file(str(path)))
    exported = {}
    for name, tensor in tensors.items():
        if not name.endswith("_proj.weight"):
            exported[name] = tensor
            continue
        module = name.removesuffix(".weight")
        weight = tensor.to(torch.bfloat16)
        if weight_strategy == "channel":
            exported[name], scale = quantize_weight_per_channel(weight)
        else:
            scale = weight.abs().amax().float().reshape(1) / FP8_MAX
            exported[name] = quantize_with_scale(weight, scale)
        exported[f"{module}.weight_scale"] = scale.to(scale_dtype)
        if input_scales is not None:
            exported[f"{module}.input_scale"] = input_scales[module].to(scale_dtype)
    destination.mkdir(parents=True)
    save_file(exported, str(destination / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(weight_strategy, static_activations=input_scales is not None)
    (destination / "config.json").write_text(json.dumps(config))
    return destination


PROJECTION_PARTS = {  # LlamaModel projection -> the Hugging Face modules fused into it, in order
    ("self_attn", "qkv_proj"): ("q_proj", "k_proj", "v_proj"),
    ("self_attn", "o_proj"): ("o_proj",),
    ("mlp", "gate_up_proj"): ("gate_proj", "up_proj"),
    ("mlp", "down_proj"): ("down_proj",),
}


def prompt_tokens(vocab_size: int, length: int = 40) -> torch.Tensor:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(14))


def prompt_logits(model) -> torch.Tensor:
    tokens = prompt_tokens(model.config.vocab_size)
    length = len(tokens)
    kv_caches = allocate_kv_cache(model.config, -(-length // 16), 16, model.embed_tokens.weight.dtype, "cpu")
    with torch.inference_mode():
        hidden = model(tokens, torch.arange(length), kv_caches, single_sequence_metadata(length, 16), None)
        return model.compute_logits(hidden)  # [length, vocab]


@pytest.fixture(scope="module")
def channel_checkpoint(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama as a per-channel, dynamic-activation FP8 export with fp32 scales (read-only)."""
    return write_fp8_checkpoint(tiny_llama_dir, tmp_path_factory.mktemp("fp8") / "channel", "channel",
                                input_scales=None, scale_dtype=torch.float32)


def test_channel_checkpoint_loads_like_quantizing_at_load(tiny_llama_dir, channel_checkpoint):
    config = ModelConfig.from_dir(channel_checkpoint)
    assert (config.quantization.weight_strategy, config.quantization.static_input_scale) == ("channel", False)
    loaded = load_model(channel_checkpoint, torch.bfloat16, "cpu")
    quantized = load_model(tiny_llama_dir, torch.bfloat16, "cpu")
    # The export quantizes every layer, and its activations one term per token, as it declares.
    quantize_model_fp8(quantized, bf16_layers=(), two_term_activations=False)
    loaded_state, quantized_state = loaded.state_dict(), quantized.state_dict()
    assert loaded_state.keys() == quantized_state.keys()
    assert any(name.endswith("qkv_proj.weight_scale") for name in loaded_state)
    for name, tensor in loaded_state.items():
        assert tensor.dtype == quantized_state[name].dtype, name
        assert torch.equal(tensor.float(), quantized_state[name].float()), name
    assert torch.equal(prompt_logits(loaded), prompt_logits(quantized))


def hf_fake_fp8_logits(source: Path, exported: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """An independent FP8 forward: Hugging Face's Llama in fp32 with each *_proj weight replaced by its
    dequantized FP8 export and its input rounded to e4m3 (fp64 rounding) with the static scale of its
    fused projection (the widest of q/k/v, of gate/up)."""
    model = copy.deepcopy(hf_base_model(source))
    group_of = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
    modules = {name: module for name, module in model.named_modules() if name.endswith("_proj")}
    widest: dict[tuple[str, str], torch.Tensor] = {}
    for name in modules:
        layer, _, kind = name.rpartition(".")
        key = (layer, group_of.get(kind, kind))
        widest[key] = torch.maximum(widest.get(key, torch.zeros(1)), exported[f"{name}.input_scale"].float())
    for name, module in modules.items():
        layer, _, kind = name.rpartition(".")
        scale = widest[(layer, group_of.get(kind, kind))].double()
        module.weight.data = exported[f"{name}.weight"].float() * exported[f"{name}.weight_scale"].float()
        module.register_forward_pre_hook(
            lambda _module, args, scale=scale: ((round_to_e4m3(args[0].double() / scale) * scale).float(),))
    with torch.no_grad():
        return model(tokens[None]).logits[0].float()  # [length, vocab]


def test_tensor_strategy_static_checkpoint_expands_and_fuses_scales(tiny_llama_dir, tmp_path):
    tokens = prompt_tokens(ModelConfig.from_dir(tiny_llama_dir).vocab_size)
    checkpoint = write_fp8_checkpoint(tiny_llama_dir, tmp_path / "tensor", "tensor",
                                      calibrated_input_scales(tiny_llama_dir, tokens), scale_dtype=torch.bfloat16)
    config = ModelConfig.from_dir(checkpoint)
    assert (config.quantization.weight_strategy, config.quantization.static_input_scale) == ("tensor", True)
    exported = load_file(str(checkpoint / "model.safetensors"))
    model = load_model(checkpoint, torch.float32, "cpu")
    for i, layer in enumerate(model.layers):
        for (block, name), parts in PROJECTION_PARTS.items():
            fp8 = getattr(getattr(layer, block), name)
            prefixes = [f"model.layers.{i}.{block}.{part}" for part in parts]
            expected_weight = torch.cat([exported[f"{p}.weight"].float() * exported[f"{p}.weight_scale"].float()
                                         for p in prefixes])
            assert torch.equal(fp8.weight.float() * fp8.weight_scale, expected_weight)
            assert fp8.input_scale == max(exported[f"{p}.input_scale"].float() for p in prefixes)
    expected = hf_fake_fp8_logits(tiny_llama_dir, exported, tokens)
    unquantized = hf_base_model(tiny_llama_dir)(tokens[None]).logits[0].detach()
    logits = prompt_logits(model)
    # Equal up to fp32 summation order (and an activation landing on the other side of a rounding midpoint).
    assert (logits - expected).abs().max() < 1e-3 * expected.abs().max()
    assert (expected - unquantized).abs().max() > 1e-2 * expected.abs().max()  # FP8 really changed the outputs


def write_config_with_quantization(tiny_llama_dir: Path, directory: Path, quantization: dict | None) -> Path:
    directory.mkdir()
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["quantization_config"] = quantization
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _edit_group(**changes):
    def edit(config: dict) -> None:
        config["config_groups"]["group_0"].update(changes)
    return edit


def _edit_weights(**changes):
    def edit(config: dict) -> None:
        config["config_groups"]["group_0"]["weights"].update(changes)
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(quant_method="gptq"), r"quantization_config\.quant_method is 'gptq'"),
    (lambda c: c.update(format="pack-quantized"), r"quantization_config\.format is 'pack-quantized'"),
    (lambda c: c["config_groups"].update(group_1=c["config_groups"]["group_0"]), r"config_groups is \['group_0', "),
    (_edit_weights(num_bits=4), r"group_0\.weights\.num_bits is 4"),
    (_edit_weights(type="int"), r"group_0\.weights\.type is 'int'"),
    (_edit_weights(symmetric=False), r"group_0\.weights\.symmetric is False"),
    (_edit_weights(strategy="group", group_size=128), r"group_0\.weights\.group_size is 128"),
    (_edit_weights(strategy="block"), r"group_0\.weights is \{'strategy': 'block'"),
    (_edit_group(input_activations=None), r"group_0\.input_activations is None; weight-only FP8"),
    (lambda c: c["config_groups"]["group_0"]["input_activations"].update(dynamic=False),
     r"group_0\.input_activations is \{'strategy': 'token', 'dynamic': False\}"),
    (lambda c: c.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), r"quantization_config\.kv_cache_scheme"),
    (lambda c: c.update(ignore=["lm_head", "re:.*down_proj"]), r"quantization_config\.ignore is"),
], ids=["method", "format", "two-groups", "int4", "int8", "asymmetric", "group", "block", "weight-only",
        "static-per-token", "kv-cache", "ignore"])
def test_unsupported_quantization_configs_are_refused_naming_the_field(tiny_llama_dir, tmp_path, edit, message):
    quantization = quantization_config("channel", static_activations=False)
    edit(quantization)
    directory = write_config_with_quantization(tiny_llama_dir, tmp_path / "config", quantization)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dir(directory)


def _copy_with_tensors(checkpoint: Path, destination: Path, edit) -> Path:
    shutil.copytree(checkpoint, destination)
    tensors = load_file(str(destination / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(destination / "model.safetensors"))
    return destination


K_PROJ = "model.layers.0.self_attn.k_proj"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.pop(f"{K_PROJ}.weight_scale"), rf"lacks tensor '{K_PROJ}\.weight_scale'"),
    (lambda t: t.update({f"{K_PROJ}.weight": t[f"{K_PROJ}.weight"].to(torch.bfloat16)}),
     rf"tensor '{K_PROJ}\.weight' has dtype torch\.bfloat16"),
    (lambda t: t.update({f"{K_PROJ}.weight_scale": t[f"{K_PROJ}.weight_scale"][:, 0]}),
     rf"'{K_PROJ}\.weight_scale' has shape \[32\], but per-channel scales .* must be \[32, 1\]"),
    (lambda t: t.update({f"{K_PROJ}.weight_scale": t[f"{K_PROJ}.weight_scale"] * float("nan")}),
     rf"'{K_PROJ}\.weight_scale' holds a scale that is not a positive finite number"),
    (lambda t: t.update({f"{K_PROJ}.input_scale": torch.ones(1)}), rf"has '{K_PROJ}\.input_scale'.*dynamic"),
    (lambda t: t.update({"lm_head.weight_scale": torch.ones(1)}), r"quantizes lm_head"),
    (lambda t: t.update({"model.embed_tokens.weight": t["model.embed_tokens.weight"].to(torch.float8_e4m3fn)}),
     r"'model\.embed_tokens\.weight' is FP8 but is not a q/k/v/o/gate/up/down weight"),
], ids=["missing-scale", "unquantized-weight", "scale-shape", "nan-scale", "input-scale", "lm-head", "fp8-embedding"])
def test_inconsistent_fp8_checkpoints_are_refused_naming_the_tensor(channel_checkpoint, tmp_path, edit, message):
    directory = _copy_with_tensors(channel_checkpoint, tmp_path / "edited", edit)
    with pytest.raises(ValueError, match=message):
        load_model(directory, torch.bfloat16, "cpu")


# ----------------------------------------------------------------------------- LoRA on an FP8 base

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_lora_on_fp8_base_adds_the_adapter_delta_in_the_activation_dtype(tiny_llama_dir, tmp_path):
    rank, alpha = 4, 8
    adapter = make_peft_adapter(tiny_llama_dir, tmp_path / "adapter", rank=rank, alpha=alpha,
                                target_modules=ALL_MODULES, seed=15, init_scale=0.2)
    peft = load_file(str(adapter / "adapter_model.safetensors"))
    config = ModelConfig.from_dir(tiny_llama_dir)
    model = load_model(tiny_llama_dir, torch.bfloat16, "cpu", quantize_to_fp8=True)
    pool = LoRASlotPool(model_config=config, num_slots=2, max_rank=8, dtype=torch.bfloat16, device="cpu")
    attach_lora(model, pool)
    pool.load(1, load_adapter_weights(adapter, config, max_rank=8))
    token_slots = [1, -1, 1, 1, -1, 1]
    adapter_rows = torch.tensor([slot == 1 for slot in token_slots])
    meta = build_sgmv_metadata(token_slots, pool.slot_ranks_host, "cpu")
    generator = torch.Generator().manual_seed(16)
    for i, layer in enumerate(model.layers):
        for (block, name), parts in PROJECTION_PARTS.items():
            wrapped = getattr(getattr(layer, block), name)
            last = i == len(model.layers) - 1  # kept in BF16 by quantize_model_fp8
            assert isinstance(wrapped, LoRALinear) and type(wrapped.base) is (Linear if last else Fp8Linear)
            x = torch.randn(len(token_slots), wrapped.base.in_features, generator=generator).to(torch.bfloat16)
            out = wrapped(x, meta)  # [T, out]
            base = wrapped.base(x, None)  # the FP8 base alone
            assert out.dtype == torch.bfloat16
            assert torch.equal(out[~adapter_rows], base[~adapter_rows])
            # The delta, from the PEFT file in fp64: (alpha / r) * B @ A @ x per packed module.
            prefix = f"base_model.model.model.layers.{i}.{block}"
            delta = torch.cat([
                (alpha / rank) * x.double() @ peft[f"{prefix}.{part}.lora_A.weight"].double().T
                @ peft[f"{prefix}.{part}.lora_B.weight"].double().T
                for part in parts
            ], dim=-1)
            expected = base.double() + delta
            assert delta[adapter_rows].abs().max() > 0.1 * base.double().abs().max()  # the adapter matters
            tolerance = 2.0 ** -6 * (base.double().abs() + delta.abs())[adapter_rows].max()
            assert (out.double() - expected)[adapter_rows].abs().max() <= tolerance
