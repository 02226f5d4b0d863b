"""The one error type that marks a training failure as the user's fault.

A fine-tuning job fails for one of two kinds of reasons, and the user must be
able to tell them apart: their input (the dataset, the hyperparameters) is
wrong and retrying will not help until they fix it, or the system failed and
retrying may. Anything raised as `TrainingInputError` is the first kind and
carries OpenAI's error fields; every other exception is a system fault.
"""
from __future__ import annotations


class TrainingInputError(ValueError):
    """Bad training input: `param` names the field at fault, `code` is stable and machine-readable."""

    def __init__(self, *, code: str, message: str, param: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


class TrainingNotFoundError(LookupError):
    """A file, job or checkpoint that does not exist in the caller's tenant."""


class TrainingConflictError(RuntimeError):
    """The request is valid but the resource's state forbids it now (e.g. deleting a file a running job reads)."""
