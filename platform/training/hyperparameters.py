"""A fine-tuning job's hyperparameters: defaults that work for a small chat dataset, and bounds.

Validation errors are pydantic's, located at the field (`loc == ("learning_rate",)`),
so the API reports them as `hyperparameters.learning_rate: ...` with that `param`.
Strict types: "3", 3.5 or true is not an epoch count.

`Hyperparameters` are a supervised job's; `DpoHyperparameters` add DPO's `beta` (methods.py
says which class a method takes).
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from loraloom.engine import LORA_MODULE_PARENTS, EngineConfig
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.schedule import AUTO, AUTO_EVALUATIONS

# An adapter is only useful if the engine can load it: its rank must fit a GPU slot.
MAX_LORA_RANK = EngineConfig.max_lora_rank
# EngineConfig caps the served context at 8192 tokens.
MAX_SEQ_LEN = 8192
ALL_TARGET_MODULES = tuple(LORA_MODULE_PARENTS)
DEFAULT_LEARNING_RATE = 2e-4
MAX_LEARNING_RATE = 0.1
# OpenAI's fine-tuning spelling, accepted beside ours: "auto" (our default) for these, and
# learning_rate_multiplier, a factor of DEFAULT_LEARNING_RATE. (eval_interval keeps "auto" as its value.)
OPENAI_AUTO_FIELDS = ("n_epochs", "batch_size", "learning_rate_multiplier")
# DPO's beta: OpenAI's default, and bounds that keep the loss's sigmoid off its flat ends.
DEFAULT_BETA = 0.1
MAX_BETA = 2.0
LEARNING_RATE_MULTIPLIER = "learning_rate_multiplier"
# Names other trainers (PEFT, transformers, other APIs) use for ours: a refusal names ours.
OTHER_SPELLINGS = {
    "epochs": "n_epochs", "num_epochs": "n_epochs", "num_train_epochs": "n_epochs",
    "lr": "learning_rate", "rank": "lora_r", "r": "lora_r", "alpha": "lora_alpha", "dropout": "lora_dropout",
    "per_device_train_batch_size": "batch_size", "max_length": "max_seq_len", "max_seq_length": "max_seq_len",
}


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    auto_fields: ClassVar[tuple[str, ...]] = OPENAI_AUTO_FIELDS

    n_epochs: int = Field(default=3, ge=1, le=100, description="Passes over the training file.")
    batch_size: int = Field(default=8, ge=1, le=256, description="Examples per optimizer step.")
    learning_rate: float = Field(
        default=DEFAULT_LEARNING_RATE, gt=0.0, le=MAX_LEARNING_RATE,
        description="Peak AdamW learning rate (linear warmup, then linear decay). OpenAI's learning_rate_multiplier "
        f"is accepted instead: this default ({DEFAULT_LEARNING_RATE:g}) times it; \"auto\" for it, n_epochs or "
        "batch_size means the default.",
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
    eval_interval: int | Literal["auto"] = Field(
        default=AUTO,
        description="Optimizer steps between two evaluations of the validation file (the last step is always "
        f"evaluated). \"auto\": {AUTO_EVALUATIONS} evaluations over the job, evenly spaced.",
    )

    @field_validator("eval_interval", mode="plain")
    @classmethod
    def _interval_or_auto(cls, value: Any) -> int | str:
        # A plain validator: a union's errors would be located at its members ("eval_interval.int").
        if value == AUTO or (type(value) is int and value >= 1):
            return value
        raise ValueError(f"must be an integer >= 1 (steps between evaluations) or \"auto\", got {value!r}")

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

    @model_validator(mode="wrap")
    @classmethod
    def _openai_spelling(cls, data: Any, handler: Any) -> Any:
        """OpenAI's spelling in ours, before the fields are checked; unknown fields named with the supported one."""
        if isinstance(data, dict):
            data = _ours(data, cls.auto_fields)
        try:
            return handler(data)
        except ValidationError as error:
            raise ValidationError.from_exception_data(
                error.title, [_with_our_name(detail, tuple(cls.model_fields)) for detail in error.errors()]
            )


class DpoHyperparameters(Hyperparameters):
    """A DPO job's: the supervised ones plus beta, OpenAI's `method.dpo.hyperparameters`."""

    auto_fields: ClassVar[tuple[str, ...]] = OPENAI_AUTO_FIELDS + ("beta",)

    beta: float = Field(
        default=DEFAULT_BETA, gt=0.0, le=MAX_BETA,
        description="How far the policy may move from the reference model: the DPO loss is "
        "-log sigmoid(beta x the gain in log-probability margin of the preferred answer). \"auto\" means "
        f"{DEFAULT_BETA:g}.",
    )


def check_rank_is_served(hyperparameters: Hyperparameters, max_lora_rank: int) -> None:
    """The job's rank must be one the servers load: their --max-lora-rank, which may be below MAX_LORA_RANK.
    Checked as a job is created and again as it starts, since the servers may have restarted with less."""
    if hyperparameters.lora_r > max_lora_rank:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters.lora_r",
            message=f"hyperparameters.lora_r: {hyperparameters.lora_r} is above the largest rank this server "
                    f"serves ({max_lora_rank}); lower it",
        )


def _ours(data: dict[str, Any], auto_fields: tuple[str, ...]) -> dict[str, Any]:
    ours = {key: value for key, value in data.items() if not (key in auto_fields and value == "auto")}
    if LEARNING_RATE_MULTIPLIER not in ours:
        return ours
    multiplier = ours.pop(LEARNING_RATE_MULTIPLIER)
    if "learning_rate" in ours:
        raise _error(LEARNING_RATE_MULTIPLIER, multiplier, "give learning_rate or learning_rate_multiplier, not both")
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not multiplier > 0:
        raise _error(LEARNING_RATE_MULTIPLIER, multiplier, "must be a positive number (a factor of the default "
                     f"learning rate, {DEFAULT_LEARNING_RATE:g}) or \"auto\"")
    if DEFAULT_LEARNING_RATE * multiplier > MAX_LEARNING_RATE:
        raise _error(LEARNING_RATE_MULTIPLIER, multiplier, f"gives a learning rate of {DEFAULT_LEARNING_RATE * multiplier:g},"
                     f" above {MAX_LEARNING_RATE:g}; use at most {MAX_LEARNING_RATE / DEFAULT_LEARNING_RATE:g}")
    ours["learning_rate"] = DEFAULT_LEARNING_RATE * float(multiplier)
    return ours


def _error(field: str, value: Any, message: str) -> ValidationError:
    return ValidationError.from_exception_data(
        "Hyperparameters", [{"type": PydanticCustomError("value_error", message), "loc": (field,), "input": value}]
    )


def _with_our_name(detail: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """An error as raised again: an unknown field's message names the field to use instead."""
    again = {"type": detail["type"], "loc": detail["loc"], "input": detail["input"]}
    if "ctx" in detail:
        again["ctx"] = detail["ctx"]
    if detail["type"] == "extra_forbidden" and len(detail["loc"]) == 1:
        name = detail["loc"][0]
        hint = (f"use {OTHER_SPELLINGS[name]}" if name in OTHER_SPELLINGS
                else "beta is a DPO hyperparameter: give it in method.dpo.hyperparameters" if name == "beta"
                else f"the hyperparameters are {', '.join(fields)} and OpenAI's "
                     f"{LEARNING_RATE_MULTIPLIER}")
        again["type"] = PydanticCustomError("extra_forbidden", "Extra inputs are not permitted: {hint}", {"hint": hint})
        again.pop("ctx", None)
    return again
