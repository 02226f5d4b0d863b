"""Random LoRA adapters written in the PEFT format, so the engine and PEFT load them through their normal paths.

Written by hand rather than with `peft.get_peft_model`: that would need a Hugging Face copy of
an 8B base in memory just to name the tensors. The layout is PEFT's: adapter_config.json plus
adapter_model.safetensors holding base_model.model.model.layers.<i>.<block>.<module>.lora_{A,B}.weight.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from loraloom.engine.config import ModelConfig
from loraloom.engine.lora.weights import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    LORA_MODULE_PARENTS,
    lora_module_shapes,
)

ALL_MODULES = tuple(LORA_MODULE_PARENTS)  # q, k, v, o, gate, up, down
# B's spread: with A ~ N(0, 1/in), each module's delta stays a small fraction of the base output.
LORA_B_STD = 0.02


def write_random_adapter(
    directory: Path,
    model_config: ModelConfig,
    rank: int,
    seed: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Path:
    """A rank-`rank` adapter on all seven modules of every layer, alpha = rank (scaling 1); returns the directory.

    The weights are drawn on `device` (fast on a GPU) from a generator seeded by `seed`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
    shapes = lora_module_shapes(model_config)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(model_config.num_layers):
        for module, parent in LORA_MODULE_PARENTS.items():
            shape = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            lora_a = torch.randn(rank, shape.in_features, generator=generator, device=device) / shape.in_features ** 0.5
            lora_b = torch.randn(shape.out_features, rank, generator=generator, device=device) * LORA_B_STD
            tensors[f"{prefix}.lora_A.weight"] = lora_a.to(dtype).cpu()  # [r, in]
            tensors[f"{prefix}.lora_B.weight"] = lora_b.to(dtype).cpu()  # [out, r]
    save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": list(ALL_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return directory


def adapter_params(model_config: ModelConfig, rank: int) -> int:
    """Parameters of a rank-`rank` adapter on all seven modules (a decode step reads them once per active adapter)."""
    shapes = lora_module_shapes(model_config).values()
    return rank * sum(shape.in_features + shape.out_features for shape in shapes) * model_config.num_layers
