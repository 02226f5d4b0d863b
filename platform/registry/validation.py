"""Validate a staged adapter against the served base: the engine's own checks, plus the base's name."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from loraloom.engine import (
    AdapterLoadError,
    AdapterSummary,
    ModelConfig,
    base_model_matches,
    inspect_adapter,
    largest_adapter_bytes,
)
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES


@dataclass(frozen=True)
class ServedBase:
    """The base model every registered version must fit (the engine's, see the router)."""

    name: str  # e.g. "SmolLM2-135M-Instruct"; also what requests name to get no adapter
    config: ModelConfig
    max_lora_rank: int

    @property
    def reserved_names(self) -> frozenset[str]:
        return ALWAYS_BASE_NAMES | {self.name}

    @property
    def largest_upload_bytes(self) -> int:
        """The most a valid adapter's two files can unpack to for this base and rank."""
        return largest_adapter_bytes(self.config, self.max_lora_rank)


def validate_adapter_dir(directory: Path, *, base: ServedBase, allow_base_mismatch: bool) -> AdapterSummary:
    """Everything the engine would check when loading (names, shapes, rank, dtype, NaN/Inf, bounds on the
    scaled weights, every adapter_config.json field, modules_to_save, embeddings), and the declared base
    model unless the caller overrides it. The error's `param` names the config field at fault, if one is."""
    try:
        summary = inspect_adapter(directory, base.config, base.max_lora_rank)
    except AdapterLoadError as error:
        # The engine names files by their path; here that is a server-side staging directory,
        # which means nothing to the uploader and should not be shown to them.
        message = str(error).replace(f"{directory}{os.sep}", "")
        raise UploadRejectedError(message, param=error.param or "files") from error
    if not allow_base_mismatch and not base_model_matches(summary.base_model, base.name):
        raise UploadRejectedError(
            f"adapter: adapter_config.json names base model {summary.base_model!r}, but this server serves "
            f"{base.name!r}; train the adapter on {base.name!r}, or set allow_base_mismatch=true if it is the same "
            "model under another name (shapes are checked either way)"
        )
    return summary
