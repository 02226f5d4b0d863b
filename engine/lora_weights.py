"""Host-side LoRA adapter weights: read a PEFT directory, validate it against the base, fold the scaling.

Everything is checked before a single tensor is used, so a bad upload fails at
load time with a message naming the module and the shapes, instead of a shape
error in the middle of a step or a silently skipped module (LESSONS.md:
modules_to_save, embedding/lm_head weights, ranks above the max, another base).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open

from loraloom.engine.config import ModelConfig

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# Pickle checkpoints that PEFT or torch may have written; never unpickled (ARCHITECTURE.md).
PICKLE_WEIGHTS_FILES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
ACCEPTED_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}

# The Llama projections an adapter may target, and the block each lives in.
LORA_MODULE_PARENTS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}

# PEFT's tensor names: base_model.model.<HF module name>.lora_{A|B}[.<adapter name>].weight
_TENSOR_NAME = re.compile(r"base_model\.model\.(model\.layers\.(\d+)\.(\w+)\.(\w+))\.lora_([AB])(?:\.\w+)?\.weight")
_BASE_ONLY_MODULES = ("embed_tokens", "lm_head")


class AdapterLoadError(ValueError):
    """The adapter files are unusable with this base model or this server; the message says why."""


class ModuleShape(NamedTuple):
    in_features: int
    out_features: int


@dataclass(frozen=True)
class LoRAModuleWeights:
    lora_a: torch.Tensor  # [r, in_features] float32
    lora_b: torch.Tensor  # [out_features, r] float32, PEFT's scaling folded in


@dataclass(frozen=True)
class AdapterWeights:
    rank: int  # the largest module rank: what a GPU slot must hold
    modules: dict[tuple[int, str], LoRAModuleWeights]  # (layer index, module name such as "q_proj")

    @property
    def target_modules(self) -> frozenset[str]:
        return frozenset(name for _, name in self.modules)


def lora_module_shapes(config: ModelConfig) -> dict[str, ModuleShape]:
    """The base model's weight shape of each projection an adapter may target."""
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    return {
        "q_proj": ModuleShape(hidden, q),
        "k_proj": ModuleShape(hidden, kv),
        "v_proj": ModuleShape(hidden, kv),
        "o_proj": ModuleShape(q, hidden),
        "gate_proj": ModuleShape(hidden, inter),
        "up_proj": ModuleShape(hidden, inter),
        "down_proj": ModuleShape(inter, hidden),
    }


@dataclass(frozen=True)
class AdapterSummary:
    """What a registry records about a validated adapter."""

    rank: int  # the largest module rank
    alpha: float  # adapter_config.json lora_alpha (rank_pattern/alpha_pattern may vary it per module)
    target_modules: tuple[str, ...]  # sorted, e.g. ("o_proj", "q_proj", "v_proj")
    dtype: str  # of the LoRA tensors: "float16" | "bfloat16" | "float32", or "mixed"
    base_model: str | None  # adapter_config.json base_model_name_or_path, if it names one


def load_adapter_weights(directory: Path, model_config: ModelConfig, max_rank: int) -> AdapterWeights:
    """Read, validate and scale a PEFT LoRA adapter; raise AdapterLoadError on anything unusable."""
    return _load(Path(directory), model_config, max_rank)[0]


def inspect_adapter(directory: Path, model_config: ModelConfig, max_rank: int) -> AdapterSummary:
    """Every check load_adapter_weights makes (NaN/Inf included), then a summary instead of the weights:
    what an upload is validated with before anything is registered."""
    weights, peft_config, dtypes = _load(Path(directory), model_config, max_rank)
    base_model = peft_config.get("base_model_name_or_path")
    return AdapterSummary(
        rank=weights.rank,
        alpha=float(peft_config["lora_alpha"]),
        target_modules=tuple(sorted(weights.target_modules)),
        dtype=str(ACCEPTED_DTYPES[next(iter(dtypes))]).removeprefix("torch.") if len(dtypes) == 1 else "mixed",
        base_model=base_model if isinstance(base_model, str) and base_model else None,
    )


def base_model_matches(declared: str | None, served_model_name: str) -> bool:
    """Whether an adapter's declared base (a hub id such as "HuggingFaceTB/SmolLM2-135M-Instruct" or the
    local path it was trained from) names the served model, compared by last path component. An adapter
    that declares none is not refused here: the shape checks still guard it."""
    if declared is None:
        return True
    return declared.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower() == served_model_name.lower()


def _load(directory: Path, model_config: ModelConfig, max_rank: int) -> tuple[AdapterWeights, dict, set[str]]:
    """(scaled weights, adapter_config.json, safetensors dtypes of the LoRA tensors)."""
    peft_config = _read_peft_config(directory)
    weights_path = _weights_path(directory)
    try:
        with safe_open(str(weights_path), framework="pt") as tensors:
            headers = {name: _header(tensors, name) for name in tensors.keys()}
            # Validate shapes and dtypes from the header alone: nothing is read until all of it is sound.
            plan = _validate_headers(headers, peft_config, model_config, max_rank)
            modules = {key: _scaled_module(tensors, names, scaling) for key, (names, scaling) in plan.items()}
    except SafetensorError as error:
        raise AdapterLoadError(f"adapter: {weights_path} is not a valid safetensors file ({error})") from error
    weights = AdapterWeights(rank=max(a.lora_a.shape[0] for a in modules.values()), modules=modules)
    return weights, peft_config, {dtype for _, dtype in headers.values()}


def _read_peft_config(directory: Path) -> dict:
    path = directory / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise AdapterLoadError(f"adapter: {path} not found; a PEFT adapter directory holds {ADAPTER_CONFIG_FILE}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterLoadError(f"adapter: peft_type is {config['peft_type']!r}; only LoRA adapters ('LORA') are served")
    if config.get("modules_to_save"):
        raise AdapterLoadError(
            f"adapter: modules_to_save {config['modules_to_save']} is not supported: loraloom serves one shared base, "
            "so an adapter may carry only LoRA weights; retrain without modules_to_save"
        )
    if config.get("use_dora"):
        raise AdapterLoadError("adapter: use_dora is set; DoRA adapters are not supported, retrain with use_dora=False")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise AdapterLoadError(
            "adapter: LoRA bias terms are not supported; retrain with bias='none' and lora_bias=False"
        )
    for field in ("r", "lora_alpha"):
        if not isinstance(config.get(field), (int, float)) or config[field] <= 0:
            raise AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} field {field!r} must be a positive number, "
                                   f"got {config.get(field)!r}")
    return config


def _weights_path(directory: Path) -> Path:
    path = directory / ADAPTER_WEIGHTS_FILE
    if path.is_file():
        return path
    pickles = [name for name in PICKLE_WEIGHTS_FILES if (directory / name).is_file()]
    if pickles:
        raise AdapterLoadError(
            f"adapter: found only {pickles[0]}, a pickle file, which is never loaded because unpickling runs code; "
            f"re-save the adapter with save_pretrained(safe_serialization=True) to get {ADAPTER_WEIGHTS_FILE}"
        )
    raise AdapterLoadError(f"adapter: {path} not found")


def _header(tensors, name: str) -> tuple[tuple[int, ...], str]:
    """(shape, safetensors dtype string) of one tensor, read from the file header without loading it."""
    tensor_slice = tensors.get_slice(name)
    return tuple(tensor_slice.get_shape()), tensor_slice.get_dtype()


def _validate_headers(
    headers: dict[str, tuple[tuple[int, ...], str]],
    peft_config: dict,
    model_config: ModelConfig,
    max_rank: int,
) -> dict[tuple[int, str], tuple[dict[str, str], float]]:
    """Check every tensor name, dtype and shape; return (layer, module) -> ({"A"|"B": tensor name}, scaling)."""
    shapes = lora_module_shapes(model_config)
    found: dict[tuple[int, str], dict[str, str]] = {}
    hf_names: dict[tuple[int, str], str] = {}
    for name, (_, dtype) in sorted(headers.items()):
        if any(part in name.split(".") for part in _BASE_ONLY_MODULES):
            raise AdapterLoadError(
                f"adapter: tensor {name!r} holds embed_tokens/lm_head weights; the base's embeddings and lm_head are "
                "shared by every adapter, so only LoRA on q/k/v/o/gate/up/down projections is served"
            )
        match = _TENSOR_NAME.fullmatch(name)
        if match is None or LORA_MODULE_PARENTS.get(match.group(4)) != match.group(3):
            raise AdapterLoadError(
                f"adapter: tensor {name!r} is not a LoRA weight of a supported module; expected "
                "base_model.model.model.layers.<i>.{self_attn|mlp}.<module>.lora_{A|B}.weight with <module> one of "
                f"{', '.join(LORA_MODULE_PARENTS)}"
            )
        hf_name, layer, module, side = match.group(1), int(match.group(2)), match.group(4), match.group(5)
        if layer >= model_config.num_layers:
            raise AdapterLoadError(
                f"adapter: tensor {name!r} is for layer {layer} but the base model has only {model_config.num_layers} "
                "layers; the adapter was trained for another base model"
            )
        if dtype not in ACCEPTED_DTYPES:
            raise AdapterLoadError(f"adapter: tensor {name!r} has dtype {dtype}; expected one of "
                                   f"{', '.join(ACCEPTED_DTYPES)}")
        if side in found.setdefault((layer, module), {}):
            raise AdapterLoadError(f"adapter: module {hf_name} has two lora_{side} tensors "
                                   f"({found[layer, module][side]!r} and {name!r}); expected one")
        found[layer, module][side] = name
        hf_names[layer, module] = hf_name
    if not found:
        raise AdapterLoadError(f"adapter: {ADAPTER_WEIGHTS_FILE} holds no LoRA tensors")

    plan: dict[tuple[int, str], tuple[dict[str, str], float]] = {}
    for key, names in found.items():
        hf_name, module = hf_names[key], key[1]
        missing = {"A", "B"} - names.keys()
        if missing:
            raise AdapterLoadError(f"adapter: module {hf_name} has no lora_{missing.pop()} tensor; "
                                   "each module needs both lora_A and lora_B")
        rank, alpha = _module_rank_alpha(peft_config, hf_name)
        if rank > max_rank:
            raise AdapterLoadError(f"adapter: module {hf_name} has rank {rank}, above the server's max LoRA rank "
                                   f"{max_rank}; retrain with r <= {max_rank}")
        base = shapes[module]
        expected = {"A": (rank, base.in_features), "B": (base.out_features, rank)}
        for side in ("A", "B"):
            actual = headers[names[side]][0]
            if actual != expected[side]:
                raise AdapterLoadError(
                    f"adapter: module {hf_name} lora_{side} has shape {list(actual)}, expected {list(expected[side])} "
                    f"(rank {rank}, base weight [out={base.out_features}, in={base.in_features}]); "
                    "the adapter was trained for another base model or its config's r does not match its weights"
                )
        scaling = alpha / math.sqrt(rank) if peft_config.get("use_rslora") else alpha / rank
        plan[key] = (names, scaling)
    return plan


def _module_rank_alpha(peft_config: dict, hf_name: str) -> tuple[int, float]:
    """PEFT's per-module rank and alpha: the first rank_pattern/alpha_pattern key that matches the
    module's name as a dotted suffix wins, else the global r / lora_alpha."""
    def lookup(patterns: dict | None, default: float) -> float:
        for pattern, value in (patterns or {}).items():
            if re.match(rf"(.*\.)?({pattern})$", hf_name):
                return value
        return default

    rank = lookup(peft_config.get("rank_pattern"), peft_config["r"])
    alpha = lookup(peft_config.get("alpha_pattern"), peft_config["lora_alpha"])
    if not isinstance(rank, int) or rank <= 0:
        raise AdapterLoadError(f"adapter: module {hf_name} has rank {rank!r} in {ADAPTER_CONFIG_FILE}; "
                               "ranks must be positive integers")
    return rank, float(alpha)


def _scaled_module(tensors, names: dict[str, str], scaling: float) -> LoRAModuleWeights:
    lora_a = tensors.get_tensor(names["A"]).float()  # [r, in]
    lora_b = tensors.get_tensor(names["B"]).float()  # [out, r]
    for side, tensor in (("A", lora_a), ("B", lora_b)):
        if not torch.isfinite(tensor).all():
            raise AdapterLoadError(f"adapter: tensor {names[side]!r} contains NaN or Inf values; the adapter is "
                                   "corrupt or its training diverged")
    return LoRAModuleWeights(lora_a=lora_a.contiguous(), lora_b=(lora_b * scaling).contiguous())
