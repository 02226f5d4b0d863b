"""eval_interval and DPO's hyperparameters: OpenAI's "auto", bounds, and the field each error names."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from loraloom.platform.training.hyperparameters import DEFAULT_BETA, DpoHyperparameters, Hyperparameters
from loraloom.platform.training.methods import hyperparameters_class


def test_eval_interval_is_auto_by_default_and_round_trips() -> None:
    assert Hyperparameters().eval_interval == "auto"
    assert Hyperparameters.model_validate_json('{"eval_interval": 5}').eval_interval == 5
    assert Hyperparameters.model_validate_json('{"eval_interval": "auto"}') == Hyperparameters()
    every = Hyperparameters(eval_interval=3)
    assert Hyperparameters.model_validate(every.model_dump()) == every


def test_beta_defaults_to_openais_and_accepts_auto() -> None:
    assert DpoHyperparameters().beta == DEFAULT_BETA == 0.1
    assert DpoHyperparameters.model_validate({"beta": "auto", "n_epochs": "auto"}) == DpoHyperparameters()
    assert DpoHyperparameters.model_validate_json('{"beta": 2}').beta == 2.0
    dpo = DpoHyperparameters(beta=0.5, lora_r=8)
    assert DpoHyperparameters.model_validate(dpo.model_dump()) == dpo
    assert (hyperparameters_class("dpo"), hyperparameters_class("supervised")) == (DpoHyperparameters, Hyperparameters)


@pytest.mark.parametrize(("model", "raw", "param", "message_part"), [
    (Hyperparameters, {"eval_interval": 0}, "eval_interval", "integer >= 1"),
    (Hyperparameters, {"eval_interval": "3"}, "eval_interval", "or \"auto\""),
    (Hyperparameters, {"eval_interval": True}, "eval_interval", "integer >= 1"),
    (Hyperparameters, {"eval_interval": 2.5}, "eval_interval", "integer >= 1"),
    (Hyperparameters, {"beta": 0.1}, "beta", "method.dpo.hyperparameters"),
    (DpoHyperparameters, {"beta": 0}, "beta", "greater than 0"),
    (DpoHyperparameters, {"beta": 2.5}, "beta", "less than or equal to 2"),
    (DpoHyperparameters, {"beta": "0.1"}, "beta", "valid number"),
    (DpoHyperparameters, {"temperature": 1}, "temperature", "eval_interval, beta"),
])
def test_invalid_values_name_the_param(model, raw: dict, param: str, message_part: str) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(raw)
    [error] = caught.value.errors()
    assert error["loc"] == (param,)
    assert message_part in error["msg"]
