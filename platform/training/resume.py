"""A run's state beyond its adapter weights, saved with each checkpoint so that a retry (the
worker died, a system fault) continues where the lost run stopped instead of starting over.

What continuing needs besides the LoRA weights: AdamW's moments and step counts, the learning
rate schedule's position, the RNG state the next step's dropout draws from, the step reached and
the tokens trained so far (validation tokens included), and with early stopping its counters
and the best weights so far (early_stopping.py: a resumed run must return the best of all its
evaluations, those before the checkpoint too). The data position follows from the step (the
example order of every epoch is drawn from the job's seed). A DPO run's reference
log-probabilities are not saved: they are recomputed exactly from the starting weights (dpo.py).
Stored as safetensors plus JSON metadata, never a pickle, like every other file the platform
reads back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

TRAINING_STATE_FILE = "training_state.safetensors"
_OPTIMIZER_PREFIX = "optimizer."
_CPU_RNG = "rng.cpu"
_CUDA_RNG = "rng.cuda"
_BEST_WEIGHTS_PREFIX = "best_weights."


@dataclass(frozen=True)
class RunPosition:
    step: int  # optimizer steps finished
    trained_tokens: int  # up to and including that step
    early_stopping: dict | None = None  # EarlyStopping's counters, when the run stops early
    best_weights: dict[str, torch.Tensor] = field(default_factory=dict)  # and its best LoRA weights so far


def save_training_state(
    path: Path, position: RunPosition, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device,
) -> None:
    optimizer_state = optimizer.state_dict()
    tensors = {
        f"{_OPTIMIZER_PREFIX}{index}.{name}": value.detach().cpu().contiguous()
        for index, values in optimizer_state["state"].items()
        for name, value in values.items()
    }
    tensors.update({f"{_BEST_WEIGHTS_PREFIX}{name}": value.detach().cpu().contiguous()
                    for name, value in position.best_weights.items()})
    tensors[_CPU_RNG] = torch.get_rng_state()
    if device.type == "cuda":
        tensors[_CUDA_RNG] = torch.cuda.get_rng_state(device)
    metadata = {
        "step": str(position.step),
        "trained_tokens": str(position.trained_tokens),
        "param_groups": json.dumps(optimizer_state["param_groups"]),
        "scheduler": json.dumps(scheduler.state_dict()),
    }
    if position.early_stopping is not None:
        metadata["early_stopping"] = json.dumps(position.early_stopping)  # floats round-trip exactly
    save_file(tensors, str(path), metadata=metadata)


def load_training_state(
    path: Path, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
) -> RunPosition:
    """Restore the optimizer, schedule and RNG saved in `path`; returns where the run stood."""
    with safe_open(str(path), framework="pt") as reader:
        metadata = reader.metadata()
    tensors = load_file(str(path))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(_OPTIMIZER_PREFIX):
            index, name = key.removeprefix(_OPTIMIZER_PREFIX).split(".", 1)
            state.setdefault(int(index), {})[name] = value
    # load_state_dict casts the moments to each parameter's device and dtype ("step" stays as saved).
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["param_groups"])})
    scheduler.load_state_dict(json.loads(metadata["scheduler"]))
    torch.set_rng_state(tensors[_CPU_RNG])
    if device.type == "cuda" and _CUDA_RNG in tensors:
        torch.cuda.set_rng_state(tensors[_CUDA_RNG], device)
    early_stopping = json.loads(metadata["early_stopping"]) if "early_stopping" in metadata else None
    best_weights = {key.removeprefix(_BEST_WEIGHTS_PREFIX): value for key, value in tensors.items()
                    if key.startswith(_BEST_WEIGHTS_PREFIX)}
    return RunPosition(step=int(metadata["step"]), trained_tokens=int(metadata["trained_tokens"]),
                       early_stopping=early_stopping, best_weights=best_weights)
