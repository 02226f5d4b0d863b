"""The one error an unusable adapter raises, from reading its config (engine/lora/peft_config.py) to
checking its weights (engine/lora/weights.py, which re-exports it)."""
from __future__ import annotations


class AdapterLoadError(ValueError):
    """The adapter files are unusable with this base model or this server; the message says why and how
    to fix it. `param` names the adapter_config.json field at fault ("lora_alpha", "rank_pattern", ...), or
    "adapter_config.json" when the file as a whole is unreadable; None when the weights file is at fault."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
