"""FP8 in the model: perplexity of the bundled model in FP8 against BF16, which projections
quantize_model_fp8 converts, and LoRA on an FP8 base."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fp8_references import HALF_ULP, PROJECTION_PARTS, SUBNORMAL_HALF_STEP, single_sequence_metadata
from lora_factory import make_peft_adapter
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.lora.layers import LoRALinear, LoRASlotPool, attach_lora, build_sgmv_metadata
from loraloom.engine.lora.weights import load_adapter_weights
from loraloom.engine.model.fp8 import BF16_LAYERS_AT_LOAD, TWO_TERM_ACTIVATIONS_AT_LOAD, Fp8Linear, quantize_model_fp8
from loraloom.engine.model.layers import Linear
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.engine.model.loader import load_model
from loraloom.engine.tokenizer import Tokenizer
from loraloom.kernels.backend import get_backend
from loraloom.kernels.dtypes import FP8_MAX


# ----------------------------------------------------------------------------- perplexity

LICENSE_DIR = Path("/usr/share/common-licenses")  # shipped by Debian's base-files package, on every machine
PERPLEXITY_CHUNK = 1024
PERPLEXITY_CHUNKS = 10  # 10,240 tokens


def held_out_tokens(model_dir: Path) -> torch.Tensor:
    """The first PERPLEXITY_CHUNK * PERPLEXITY_CHUNKS tokens of the license texts (symlinks skipped: aliases)."""
    files = sorted(path for path in LICENSE_DIR.iterdir() if path.is_file() and not path.is_symlink())
    text = "\n\n".join(path.read_text() for path in files)
    ids = Tokenizer.from_dir(model_dir).encode(text, add_special_tokens=False)
    needed = PERPLEXITY_CHUNK * PERPLEXITY_CHUNKS
    assert len(ids) >= needed, f"{LICENSE_DIR} holds only {len(ids)} tokens, {needed} are needed"
    return torch.tensor(ids[:needed])


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


# The issue asks for FP8 within 1% of BF16. The recipe of quantize_model_fp8 (two-term per-token
# activations, last decoder layer in BF16; engine/model/fp8.py BF16_LAYERS_AT_LOAD says why and what else
# was tried) measured x1.0001 of bf16 over 20,480 of these tokens; before it, all layers one-term FP8
# x1.026, one-term with the last layer in BF16 x1.0126 (~0.4% of rounding noise between equivalent
# variants). Against float32 on the first 10,240 tokens (this test): x1.0044.
PERPLEXITY_RATIO_BOUND = 1.01
# The reference runs in float32, whose perplexity over the 20,480 tokens (16.025) is bf16's (16.024) to
# 0.01%: the same bound, on every CPU at float32's speed. bf16 GEMMs are ~2x faster than fp32 only on CPUs
# with bf16 instructions; an AMD EPYC without them ran this test in bf16 past its 15-minute timeout.
REFERENCE_DTYPE = torch.float32


# About 2 to 4 minutes of `make test` on a 2-core machine: the quality bound is checked on every run.
def test_fp8_perplexity_within_one_percent_of_bf16(model_dir):
    # The FP8 model differs from the reference only in the projections quantize_model_fp8 converts, whose
    # GEMMs run in fp32 (kernels/reference.py fp8_scaled_mm), as on the GPU.
    tokens = held_out_tokens(model_dir)
    reference = perplexity(load_model(model_dir, REFERENCE_DTYPE, "cpu"), tokens, REFERENCE_DTYPE)
    fp8 = perplexity(load_model(model_dir, REFERENCE_DTYPE, "cpu", quantize_to_fp8=True), tokens, REFERENCE_DTYPE)
    report = (f"perplexity over {len(tokens)} tokens of {LICENSE_DIR}: {REFERENCE_DTYPE} {reference:.4f}, "
              f"fp8 {fp8:.4f} (x{fp8 / reference:.4f})")
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
