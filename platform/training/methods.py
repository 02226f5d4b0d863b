"""The training methods, as OpenAI's `method.type` names them, and what each needs of a job.

  supervised  next-token loss on the answers of chat, instruction or text files (Hyperparameters)
  dpo         Direct Preference Optimization on preference files (DpoHyperparameters, with beta)

A file is uploaded in any format; a job refuses one that is not in its method's, naming the job's
field (training_file or validation_file): `check_file_method` is that check, for the job API at
create time (with the file's stored format) and for the runner's load_dataset.
"""
from __future__ import annotations

import enum

from loraloom.platform.training.errors import TrainingInputError

SUPERVISED = "supervised"
DPO = "dpo"
METHODS = (SUPERVISED, DPO)
# The formats (datasets.DatasetFormat values) each method trains on.
METHOD_FORMATS = {SUPERVISED: ("chat", "instruction", "text"), DPO: ("preference",)}


def check_method(method: str, param: str = "method.type") -> None:
    if method not in METHODS:
        raise TrainingInputError(code="invalid_method", param=param,
                                 message=f"{param}: {method!r} is not a training method; use one of {', '.join(METHODS)}")


def check_file_method(file_format: str | enum.Enum, method: str, param: str) -> None:
    """Raise TrainingInputError (naming `param`) unless a file in `file_format` can train a `method` job."""
    check_method(method)
    name = file_format.value if isinstance(file_format, enum.Enum) else file_format
    formats = METHOD_FORMATS[method]
    if name not in formats:
        needs = " or ".join(formats)
        hint = ("DPO trains on preference pairs: one object per line with input.messages, preferred_output and "
                "non_preferred_output" if method == DPO else
                "a preference file trains a DPO job: set method to {\"type\": \"dpo\"}")
        raise TrainingInputError(
            code="invalid_file_format", param=param,
            message=f"{param}: the file is in {name} format, but a {method} job needs a file in {needs} format; {hint}",
        )


def hyperparameters_class(method: str):
    """The hyperparameters model of `method`'s jobs: Hyperparameters, or DpoHyperparameters for DPO."""
    from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters

    check_method(method)
    return DpoHyperparameters if method == DPO else Hyperparameters
