"""A fine-tuning job's hyperparameters: defaults that work for a small chat dataset, and bounds.

Validation errors are pydantic's, located at the field (`loc == ("learning_rate",)`),
so the API reports them as `hyperparameters.learning_rate: ...` with that `param`.
Strict types: "3", 3.5 or true is not an epoch count.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loraloom.engine import LORA_MODULE_PARENTS, EngineConfig

# An adapter is only useful if the engine can load it: its rank must fit a GPU slot.
MAX_LORA_RANK = EngineConfig.max_lora_rank
# EngineConfig caps the served context at 8192 tokens.
MAX_SEQ_LEN = 8192
ALL_TARGET_MODULES = tuple(LORA_MODULE_PARENTS)


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    n_epochs: int = Field(default=3, ge=1, le=100, description="Passes over the training file.")
    batch_size: int = Field(default=8, ge=1, le=256, description="Examples per optimizer step.")
    learning_rate: float = Field(
        default=2e-4, gt=0.0, le=0.1, description="Peak AdamW learning rate (linear warmup, then linear decay)."
    )
    lora_r: int = Field(default=16, ge=1, le=MAX_LORA_RANK, description="LoRA rank.")
    lora_alpha: float = Field(default=32.0, gt=0.0, le=4096.0, description="LoRA scaling numerator (alpha / r).")
    lora_dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(ALL_TARGET_MODULES),
        min_length=1,
        description=f"Projections to adapt, any of {', '.join(ALL_TARGET_MODULES)}.",
    )
    max_seq_len: int = Field(
        default=1024, ge=16, le=MAX_SEQ_LEN, description="Longest example in tokens; longer ones are rejected."
    )

    @field_validator("target_modules")
    @classmethod
    def _known_unique_modules(cls, modules: list[str]) -> list[str]:
        for module in modules:
            if module not in LORA_MODULE_PARENTS:
                raise ValueError(
                    f"{module!r} is not a module LoRA can target here; use any of {', '.join(ALL_TARGET_MODULES)}"
                )
        if len(set(modules)) != len(modules):
            raise ValueError(f"{modules} lists a module twice; list each once")
        return modules
