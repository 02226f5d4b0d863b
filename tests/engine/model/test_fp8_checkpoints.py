"""Compressed-tensors FP8 checkpoints: they load like quantizing at load, per-tensor scales expand and
fused projections take the widest static scale, and unsupported or inconsistent exports are refused
naming the field or tensor."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fp8_references import PROJECTION_PARTS, round_to_e4m3, single_sequence_metadata
from lora_factory import hf_base_model
from loraloom.engine.config import ModelConfig
from loraloom.engine.model.fp8 import quantize_model_fp8
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.engine.model.loader import checkpoint_files, load_model
from loraloom.kernels.dtypes import FP8_MAX, quantize_with_scale
from loraloom.kernels.fp8 import quantize_weight_per_channel


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
