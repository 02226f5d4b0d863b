"""Hyperparameter defaults, bounds and the field each error names."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from loraloom.engine.config import EngineConfig
from loraloom.engine.lora.files import LORA_MODULE_PARENTS
from loraloom.platform.training.hyperparameters import Hyperparameters

MAX_RANK = EngineConfig().max_lora_rank  # what an engine with default sizing serves


def test_defaults_are_valid_and_servable() -> None:
    defaults = Hyperparameters()
    assert Hyperparameters.model_validate(defaults.model_dump()) == defaults
    assert defaults.lora_r <= MAX_RANK
    assert set(defaults.target_modules) == set(LORA_MODULE_PARENTS)
    assert defaults.n_epochs >= 1 and defaults.batch_size >= 1 and 0 < defaults.learning_rate < 1e-2


def test_json_body_round_trip() -> None:
    raw = '{"n_epochs": 2, "learning_rate": 0.001, "lora_r": 8, "target_modules": ["q_proj", "v_proj"]}'
    parsed = Hyperparameters.model_validate_json(raw)
    assert (parsed.n_epochs, parsed.learning_rate, parsed.lora_r, parsed.target_modules) == (
        2, 0.001, 8, ["q_proj", "v_proj"]
    )
    assert parsed.batch_size == Hyperparameters().batch_size


@pytest.mark.parametrize(
    ("raw", "param", "message_part"),
    [
        ({"n_epochs": 0}, "n_epochs", "greater than or equal to 1"),
        ({"n_epochs": "3"}, "n_epochs", "valid integer"),
        ({"n_epochs": True}, "n_epochs", "valid integer"),
        ({"n_epochs": 2.5}, "n_epochs", "valid integer"),
        ({"batch_size": 0}, "batch_size", "greater than or equal to 1"),
        ({"learning_rate": 0}, "learning_rate", "greater than 0"),
        ({"learning_rate": 0.5}, "learning_rate", "less than or equal to 0.1"),
        ({"lora_r": MAX_RANK + 1}, "lora_r", f"less than or equal to {MAX_RANK}"),
        ({"lora_alpha": -1}, "lora_alpha", "greater than 0"),
        ({"lora_dropout": 1.0}, "lora_dropout", "less than 1"),
        ({"target_modules": []}, "target_modules", "at least 1 item"),
        ({"target_modules": ["lm_head"]}, "target_modules", "'lm_head' is not a module LoRA can target"),
        ({"target_modules": ["q_proj", "q_proj"]}, "target_modules", "lists a module twice"),
        ({"target_modules": "q_proj"}, "target_modules", "valid list"),
        ({"max_seq_len": 8}, "max_seq_len", "greater than or equal to 16"),
        ({"max_seq_len": 100_000}, "max_seq_len", "less than or equal to 8192"),
        ({"epochs": 3}, "epochs", "Extra inputs are not permitted: use n_epochs"),
        ({"lr": 1e-3}, "lr", "use learning_rate"),
        ({"warmup": 3}, "warmup", "the hyperparameters are n_epochs, batch_size, learning_rate"),
        ({"learning_rate_multiplier": 2, "learning_rate": 1e-3}, "learning_rate_multiplier", "not both"),
        ({"learning_rate_multiplier": 0}, "learning_rate_multiplier", "positive number"),
        ({"learning_rate_multiplier": 1000}, "learning_rate_multiplier", "use at most 500"),
        ({"lora_r": "auto"}, "lora_r", "valid integer"),  # "auto" is OpenAI's, for OpenAI's fields only
    ],
)
def test_invalid_values_name_the_param(raw: dict, param: str, message_part: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Hyperparameters.model_validate(raw)
    [error] = caught.value.errors()
    assert error["loc"] == (param,)
    assert message_part in error["msg"]


def test_openai_spelling_is_accepted_beside_ours() -> None:
    """OpenAI's `"auto"` means our default, and learning_rate_multiplier scales our default learning rate."""
    defaults = Hyperparameters()
    auto = Hyperparameters.model_validate({"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto"})
    assert auto == defaults
    scaled = Hyperparameters.model_validate_json('{"n_epochs": 2, "learning_rate_multiplier": 0.5}')
    assert (scaled.n_epochs, scaled.learning_rate) == (2, defaults.learning_rate * 0.5)
    assert "learning_rate_multiplier" not in scaled.model_dump()  # stored as what the trainer uses
