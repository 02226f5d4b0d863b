"""The validation loss of adapter versions as a job's trainer measures its own (the promotion gate's
comparison, promotion.py): on the job's validation examples, with the job's method's objective
(trainer.method_objective), batch size and the base in the dtype the trainer uses.

For DPO the loss is measured against the job's own reference log-probabilities: the model the job
started from (the base with a fresh LoRA, whose B matrices are zero, or the job's starting checkpoint's
weights), computed by the objective's `prepare` exactly as the run computed them. Each version is then
loaded beside the job's LoRA as a second PEFT adapter on one copy of the base (its own rank, alpha and
modules) and made the active one while it is evaluated, so the base is loaded once for all of them.

Imports torch: only the worker's child process loads this module.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from loraloom.platform.training.datasets import Example
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.lora_loading import load_start_weights
from loraloom.platform.training.methods import DPO
from loraloom.platform.training.trainer import default_device, load_lora_model, method_objective

JOB_ADAPTER = "default"  # PEFT's name for the adapter load_lora_model adds: the job's own


def version_losses(
    *,
    base_model_dir: Path,
    eval_examples: Sequence[Example],
    hyperparameters: Hyperparameters,
    method: str,
    seed: int,
    start_from: Path | None,
    versions: Mapping[int, Path],
    device: torch.device | None = None,
) -> dict[int, float]:
    """`valid_loss` of each version (number -> its PEFT directory) on `eval_examples`, as the job's
    trainer computes its own. `seed` and `start_from` are the job's run's: they make DPO's reference."""
    device = device or default_device()
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):  # the fresh LoRA's initialization draws from the RNG
        model = load_lora_model(Path(base_model_dir), hyperparameters, device, seed)
        if start_from is not None and method == DPO:  # only DPO's reference depends on where the job started
            load_start_weights(model, Path(start_from), hyperparameters, device)
        objective = method_objective(method, [], eval_examples, hyperparameters, device)
        objective.prepare(model)
        losses = {}
        for number, directory in versions.items():
            name = f"version-{number}"
            model.load_adapter(str(directory), adapter_name=name)
            model.set_adapter(name)
            try:
                losses[number] = objective.evaluate(model)["valid_loss"]
            finally:
                model.set_adapter(JOB_ADAPTER)
                model.delete_adapter(name)
    return losses
