"""The served model's generation_config.json as request defaults (engine/generation_defaults.py) and
the bundled model's recommended sampling written at import (engine/model/bundled.py)."""
from __future__ import annotations

import json

import pytest

from loraloom.engine.config import EngineConfig
from loraloom.engine.generation_defaults import GenerationDefaults, read_generation_defaults
from loraloom.engine.model.bundled import RECOMMENDED_SAMPLING, write_recommended_sampling


def write_config(directory, **values) -> None:
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": True} | values))


def test_sampling_values_are_read_and_max_new_tokens_becomes_max_tokens(tmp_path):
    write_config(tmp_path, temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1, max_new_tokens=256)
    defaults = read_generation_defaults(tmp_path)
    assert defaults == GenerationDefaults(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1, max_tokens=256)
    assert defaults.chosen() == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1,
                                 "max_tokens": 256}


def test_none_ignores_the_file_and_a_missing_file_sets_nothing(tmp_path):
    assert read_generation_defaults(tmp_path).chosen() == {}
    write_config(tmp_path, temperature=0.6)
    assert read_generation_defaults(tmp_path, "none") == GenerationDefaults()
    # An integer temperature is a number like any other.
    write_config(tmp_path, temperature=1)
    assert read_generation_defaults(tmp_path).temperature == 1.0


@pytest.mark.parametrize("key, value", [("temperature", "0.7"), ("top_k", 2.5), ("max_new_tokens", True)])
def test_a_value_of_the_wrong_type_names_the_file_and_key(tmp_path, key, value):
    write_config(tmp_path, **{key: value})
    with pytest.raises(ValueError, match=f"generation_config.json: {key} is"):
        read_generation_defaults(tmp_path)


@pytest.mark.parametrize("key, value", [("temperature", 3.5), ("temperature", -0.1), ("top_p", 0), ("top_p", 1.5),
                                        ("top_k", -2), ("repetition_penalty", 0), ("max_new_tokens", 0)])
def test_a_value_out_of_a_requests_range_names_the_file_key_and_range(tmp_path, key, value):
    """A default stands in for the request's own value, so it must be one a request could send."""
    write_config(tmp_path, **{key: value})
    with pytest.raises(ValueError, match=f"generation_config.json: {key} is .*; it must be .*--generation-config none"):
        read_generation_defaults(tmp_path)


def test_an_unknown_source_is_refused():
    with pytest.raises(ValueError, match="generation_config is 'vllm'"):
        EngineConfig(generation_config="vllm")


def test_recommended_sampling_is_added_without_overriding_an_operators_values(tmp_path):
    write_recommended_sampling(tmp_path)  # no file yet
    assert read_generation_defaults(tmp_path).chosen() == RECOMMENDED_SAMPLING
    write_config(tmp_path, temperature=0.7)
    write_recommended_sampling(tmp_path)
    written = json.loads((tmp_path / "generation_config.json").read_text())
    assert (written["temperature"], written["top_p"], written["eos_token_id"]) == (0.7, 0.9, 2)


def test_the_bundled_model_samples_as_its_model_card_recommends(model_dir):
    assert read_generation_defaults(model_dir).chosen() == {"temperature": 0.2, "top_p": 0.9}
