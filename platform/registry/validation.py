"""Validate a staged adapter against the served base: the engine's own checks, plus the base's name."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from loraloom.engine import (
    AdapterLoadError,
    AdapterSummary,
    EngineClient,
    ModelConfig,
    base_model_matches,
    inspect_adapter,
    largest_adapter_bytes,
)
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES


@dataclass(frozen=True)
class ServedBase:
    """The base model every registered version must fit: the one the engine serves, at its largest rank."""

    name: str  # e.g. "SmolLM2-135M-Instruct"; also what requests name to get no adapter
    config: ModelConfig
    max_lora_rank: int

    @classmethod
    def of(cls, engine: EngineClient) -> ServedBase:
        return cls(name=engine.model_name, config=engine.model_config, max_lora_rank=engine.max_lora_rank)

    @property
    def reserved_names(self) -> frozenset[str]:
        return ALWAYS_BASE_NAMES | {self.name}

    @property
    def largest_upload_bytes(self) -> int:
        """The most a valid adapter's two files can unpack to for this base and rank."""
        return largest_adapter_bytes(self.config, self.max_lora_rank)


def validate_adapter_dir(directory: Path, *, base: ServedBase) -> AdapterSummary:
    """Everything the engine would check when loading (names, shapes, rank, dtype, NaN/Inf, bounds on the
    scaled weights, every adapter_config.json field, modules_to_save, embeddings, the modules its config
    selects). The error's `param` names the config field at fault, if one is.

    Compatibility is what the weights say: every module must exist in the served base with the base's
    shapes (hidden and intermediate sizes, heads) and every layer index must be one of its layers. The
    declared base_model_name_or_path is not a test: PEFT writes the path a model was loaded from (a local
    copy trains under its folder's name), so a different name is recorded (base_model_warning) instead."""
    try:
        summary = inspect_adapter(directory, base.config, base.max_lora_rank)
    except AdapterLoadError as error:
        # The engine names files by their path; here that is a server-side staging directory,
        # which means nothing to the uploader and should not be shown to them.
        message = str(error).replace(f"{directory}{os.sep}", "")
        raise UploadRejectedError(message, param=error.param or "files") from error
    return summary


def base_model_warning(declared: str | None, served: str) -> str | None:
    """What a version record says of an adapter whose config names another base than the served one."""
    if base_model_matches(declared, served):
        return None
    return (f"adapter_config.json names base model {declared!r}, not the served {served!r}; it was accepted because "
            f"its modules and shapes fit {served!r}. If it was trained on another model of the same shape, its "
            "outputs will not be what it was trained for")
