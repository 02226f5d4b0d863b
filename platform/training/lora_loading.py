"""LoRA weights from a checkpoint directory into the model a run trains: to resume the same job,
or to start a new one from another job's checkpoint (`from_checkpoint`, weights only).

A starting checkpoint must have the job's rank, alpha and target modules: its weights are
the adapter's function only at the scale (alpha / r) and on the modules they were trained for.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import Hyperparameters

START_PARAM = "from_checkpoint"


def lora_state(model) -> dict[str, torch.Tensor]:
    """The PEFT model's LoRA weights, named as in its adapter file."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_lora_state(model, weights: dict[str, torch.Tensor]) -> list[str]:
    """Copy adapter-file-named `weights` into the model; the problems (unexpected or missing LoRA keys)."""
    from peft import set_peft_model_state_dict

    loaded = set_peft_model_state_dict(model, weights)
    missing_lora = [key for key in loaded.missing_keys if "lora_" in key]
    return ([f"unexpected {loaded.unexpected_keys[:3]}"] if loaded.unexpected_keys else []) + (
        [f"missing {missing_lora[:3]}"] if missing_lora else [])


def load_checkpoint_weights(model, directory: Path, device: torch.device) -> None:
    """A checkpoint of this very job (a retry resuming it): a mismatch is a system fault."""
    from safetensors.torch import load_file

    problems = load_lora_state(model, load_file(str(directory / ADAPTER_WEIGHTS_FILE), device=str(device)))
    if problems:
        raise ValueError(f"checkpoint {directory} does not fit this job's LoRA modules: {', '.join(problems)}")


def load_start_weights(model, directory: Path, hyperparameters: Hyperparameters, device: torch.device) -> None:
    """Another job's checkpoint as this job's starting weights; TrainingInputError (from_checkpoint) if it does not fit."""
    from safetensors.torch import load_file

    try:
        config = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())
        weights = load_file(str(directory / ADAPTER_WEIGHTS_FILE), device=str(device))
    except (OSError, ValueError) as error:
        raise TrainingInputError(code="invalid_checkpoint", param=START_PARAM,
                                 message=f"{START_PARAM}: the checkpoint cannot be read ({error}); choose another") from error
    theirs = {"lora_r": config.get("r"), "lora_alpha": config.get("lora_alpha"),
              "target_modules": sorted(_as_list(config.get("target_modules")))}
    ours = {"lora_r": hyperparameters.lora_r, "lora_alpha": hyperparameters.lora_alpha,
            "target_modules": sorted(hyperparameters.target_modules)}
    differences = [f"{name} {theirs[name]} (the job's is {ours[name]})" for name in ours if theirs[name] != ours[name]]
    problems = [] if differences else load_lora_state(model, weights)
    if differences or problems:
        raise TrainingInputError(
            code="checkpoint_mismatch", param=START_PARAM,
            message=f"{START_PARAM}: the checkpoint's adapter does not fit this job: "
                    f"{'; '.join(differences or problems)}; set the job's lora_r, lora_alpha and target_modules to "
                    "the checkpoint's",
        )


def _as_list(modules: object) -> list[str]:
    """PEFT's target_modules: a list of names, or one pattern string."""
    return [modules] if isinstance(modules, str) else list(modules or [])
