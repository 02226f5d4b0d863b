"""A job's training options beyond its files, as a create request gives them (OpenAI's shapes):
`method` (supervised or DPO, each with its hyperparameters; the top-level `hyperparameters`
still means supervised), `metadata`, `early_stopping`. Every refusal names the field at fault."""
from __future__ import annotations

from typing import Any

from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.methods import SUPERVISED, hyperparameters_class

# OpenAI's bounds on a job's metadata.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def hyperparameters_of(method: str, stored: dict[str, Any]) -> Hyperparameters:
    """A job's stored hyperparameters read back. Not strict: JSON has no float/int distinction
    (PostgreSQL may hand back 32 for 32.0)."""
    return hyperparameters_class(method).model_validate(stored, strict=False)


def choose_hyperparameters(
    method: str, top_level: Hyperparameters | None, of_method: Hyperparameters | None
) -> Hyperparameters:
    """The job's hyperparameters: the method's own, or the top-level ones of a supervised job, or the
    method's defaults. Both given is ambiguous (which wins?): refused, as are top-level ones for DPO."""
    if top_level is not None and of_method is not None:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters",
            message=f"hyperparameters: given both at the top level and in method.{method}.hyperparameters; "
                    f"give them once, in method.{method}.hyperparameters",
        )
    if top_level is not None and method != SUPERVISED:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters",
            message=f"hyperparameters: the top-level hyperparameters are a supervised job's; give a {method} job's "
                    f"in method.{method}.hyperparameters",
        )
    chosen = of_method if of_method is not None else top_level
    return chosen if chosen is not None else hyperparameters_class(method)()


def check_early_stopping(patience: int | None, validation_file: str | None) -> None:
    """Early stopping watches the validation loss: a job without a validation file has none."""
    if patience is not None and validation_file is None:
        raise TrainingInputError(
            code="invalid_early_stopping", param="early_stopping",
            message="early_stopping: stopping early needs a validation loss to watch; give a validation_file "
                    "or leave early_stopping out",
        )
