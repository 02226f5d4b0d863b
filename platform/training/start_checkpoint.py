"""A job created `from_checkpoint` starts its LoRA weights from that checkpoint (with a fresh optimizer
and schedule): the checkpoint's adapter must have the job's rank, alpha and target modules, or its
weights would not fit the job's LoRA modules, or not at the scale they were trained for. Checked as the
job is created, from the checkpoint's stored adapter_config.json (the trainer checks again as it loads
them, lora_loading.py)."""
from __future__ import annotations

import json

from loraloom.platform.db.models import FineTuningCheckpoint
from loraloom.platform.storage import BlobStore, content_key
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import Hyperparameters


def not_found(checkpoint_id: str) -> TrainingInputError:
    # Another tenant's checkpoint reads as a missing one: its existence is not this caller's business.
    return TrainingInputError(
        code="checkpoint_not_found", param="from_checkpoint",
        message=f"from_checkpoint: no checkpoint {checkpoint_id!r}; GET /v1/fine_tuning/jobs/{{job_id}}/checkpoints "
                "lists a job's",
    )


def check_base(checkpoint: FineTuningCheckpoint, trained_on: str, served: str) -> None:
    """A checkpoint trained on another base (the server served another model then) adapts another model."""
    if trained_on != served:
        raise TrainingInputError(
            code="invalid_checkpoint", param="from_checkpoint",
            message=f"from_checkpoint: checkpoint {checkpoint.id} was trained on {trained_on!r}; this server trains "
                    f"adapters for {served!r}",
        )


def check_fits(store: BlobStore, checkpoint: FineTuningCheckpoint, hyperparameters: Hyperparameters) -> None:
    with store.open(content_key(checkpoint.config_sha256)) as blob:
        config = json.loads(blob.read())
    rank, modules = config.get("r"), sorted(config.get("target_modules") or [])
    if rank != hyperparameters.lora_r:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters.lora_r",
            message=f"hyperparameters.lora_r: {hyperparameters.lora_r}, but from_checkpoint {checkpoint.id} has rank "
                    f"{rank}; set lora_r to {rank} to start from it",
        )
    alpha = config.get("lora_alpha")
    if not isinstance(alpha, (int, float)) or float(alpha) != hyperparameters.lora_alpha:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters.lora_alpha",
            message=f"hyperparameters.lora_alpha: {hyperparameters.lora_alpha:g}, but from_checkpoint {checkpoint.id} "
                    f"was trained with lora_alpha {alpha}; set lora_alpha to {alpha} to start from it",
        )
    if modules != sorted(hyperparameters.target_modules):
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters.target_modules",
            message=f"hyperparameters.target_modules: {sorted(hyperparameters.target_modules)}, but from_checkpoint "
                    f"{checkpoint.id} adapts {modules}; set target_modules to those to start from it",
        )
