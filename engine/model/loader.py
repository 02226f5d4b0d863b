"""Load a Llama checkpoint in Hugging Face layout into `LlamaModel`.

The checkpoint is `model.safetensors`, or shards listed by
`model.safetensors.index.json`. Pickled `.bin` checkpoints are refused: loading
them runs arbitrary code. Every tensor is checked against the shapes config.json
implies before q/k/v are fused into `qkv_proj` and gate/up into `gate_up_proj`
(one matmul instead of three, and two, per layer and step).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.fp8 import quantize_model_fp8, take_fp8_scales, use_fp8_linears
from loraloom.engine.model.kv_scales import KV_SCALE_NAMES, set_kv_cache_scales, take_kv_cache_scales
from loraloom.engine.model.llama import LlamaModel
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Fused tensor (our name, per layer) <- the Hugging Face tensors concatenated along the output dim.
FUSED_PROJECTIONS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in index order."""
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"loader: {index_path} has no 'weight_map'; re-save the checkpoint with save_pretrained")
        files = [model_dir / name for name in dict.fromkeys(weight_map.values())]
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"loader: shards listed in {index_path} are missing: {', '.join(missing)}")
        return files
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise FileNotFoundError(
        f"loader: {model_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}; "
        "only safetensors checkpoints are loaded (convert .bin checkpoints with save_pretrained(safe_serialization=True))"
    )


def expected_checkpoint_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> the shape config.json implies."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size = config.num_heads * config.head_dim
    kv_size = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    per_layer = {
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_size, hidden),
        "self_attn.k_proj.weight": (kv_size, hidden),
        "self_attn.v_proj.weight": (kv_size, hidden),
        "self_attn.o_proj.weight": (hidden, q_size),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    for i in range(config.num_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in per_layer.items()})
    return shapes


def _is_ignorable(name: str, config: ModelConfig) -> bool:
    # Old checkpoints saved the rotary inverse frequencies (recomputed from config here);
    # some tied checkpoints also store lm_head.weight, a copy of the embedding.
    return name.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and name == "lm_head.weight")


def _check_checkpoint(tensors: dict[str, torch.Tensor], config: ModelConfig, model_dir: Path) -> None:
    expected = expected_checkpoint_shapes(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise ValueError(
            f"loader: {model_dir} lacks {len(missing)} tensor(s) config.json requires, first {missing[0]!r}; "
            "the checkpoint is incomplete or config.json belongs to another model"
        )
    unexpected = [name for name in tensors if name not in expected and not _is_ignorable(name, config)]
    if unexpected:
        raise ValueError(
            f"loader: {model_dir} has tensor(s) a Llama model without biases does not use: {unexpected[:5]}; "
            "only model_type 'llama' checkpoints with attention_bias=false and mlp_bias=false are supported"
        )
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"loader: tensor {name!r} has shape {tuple(tensors[name].shape)} but config.json implies {shape}; "
                "check that config.json matches the weights"
            )


def _fuse(tensors: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names -> LlamaModel parameter names, fusing the projections."""
    weights = {
        "embed_tokens.weight": tensors["model.embed_tokens.weight"],
        "norm.weight": tensors["model.norm.weight"],
    }
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = tensors["lm_head.weight"]
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm", "self_attn.o_proj", "mlp.down_proj"):
            weights[f"layers.{i}.{name}.weight"] = tensors[f"{prefix}{name}.weight"]
        for fused, parts in FUSED_PROJECTIONS.items():
            # pop: each part is dropped as soon as its fused copy exists, bounding peak host memory.
            weights[f"layers.{i}.{fused}.weight"] = torch.cat([tensors.pop(f"{prefix}{part}.weight") for part in parts])
    return weights


def load_weights(model_dir: str | Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (on the CPU, in the checkpoint's dtype) under LlamaModel's parameter names,
    FP8 KV cache scales (`layers.{i}.self_attn.k_scale` / `v_scale`) included when the checkpoint has them."""
    model_dir = Path(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir):
        tensors.update(load_file(str(path)))
    kv_scales = take_kv_cache_scales(tensors, config)
    # An FP8 checkpoint's scales leave `tensors` here, already fused; its weights are checked like any other.
    fp8_scales = take_fp8_scales(tensors, config) if config.quantization is not None else {}
    _check_checkpoint(tensors, config, model_dir)
    return {**_fuse(tensors, config), **fp8_scales, **kv_scales}


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    attention: KernelBackend = REFERENCE_BACKEND,
    quantize_to_fp8: bool = False,
    fp8_activation_terms: int = 2,
) -> LlamaModel:
    """A LlamaModel built from model_dir/config.json, with the checkpoint's weights cast to `dtype`.

    An FP8 checkpoint (config.json quantization_config) loads its projections as FP8 as stored;
    `quantize_to_fp8` quantizes an unquantized checkpoint's projections at load (engine/model/fp8.py), their
    activations in `fp8_activation_terms` e4m3 terms per token.
    """
    config = ModelConfig.from_dir(model_dir)
    weights = load_weights(model_dir, config)
    kv_scales = {name: weights.pop(name) for name in list(weights) if name.endswith(KV_SCALE_NAMES)}
    model = LlamaModel(config, dtype, device, attention)
    if config.quantization is not None:
        use_fp8_linears(model, static_input_scale=config.quantization.static_input_scale)
    model.load_state_dict(weights, strict=True)
    if kv_scales:
        set_kv_cache_scales(model, kv_scales)
    if quantize_to_fp8 and config.quantization is None:
        quantize_model_fp8(model, two_term_activations=fp8_activation_terms == 2)
    return model.eval()
