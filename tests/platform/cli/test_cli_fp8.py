"""`loraloom serve --quantization`, `--kv-cache-dtype` and `--lora-dtype`: the flags reach EngineConfig, and only
known values parse."""
from __future__ import annotations

import pytest

from loraloom.platform.cli.main import build_parser, main
from loraloom.platform.cli.serve import engine_config


def test_quantization_flag_maps_onto_engine_config():
    assert engine_config(build_parser().parse_args(["serve"])).quantization is None
    assert engine_config(build_parser().parse_args(["serve", "--quantization", "fp8"])).quantization == "fp8"


def test_fp8_activation_terms_flag_maps_onto_engine_config_and_refuses_other_counts(capsys):
    assert engine_config(build_parser().parse_args(["serve"])).fp8_activation_terms == 2
    parsed = build_parser().parse_args(["serve", "--quantization", "fp8", "--fp8-activation-terms", "1"])
    assert engine_config(parsed).fp8_activation_terms == 1
    with pytest.raises(SystemExit):
        main(["serve", "--fp8-activation-terms", "3"])
    assert "--fp8-activation-terms" in capsys.readouterr().err


def test_unknown_quantization_is_an_argparse_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--quantization", "int4"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--quantization" in error and "fp8" in error


def test_kv_cache_dtype_flag_maps_onto_engine_config():
    assert engine_config(build_parser().parse_args(["serve"])).kv_cache_dtype == "auto"
    parsed = build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8"])
    assert engine_config(parsed).kv_cache_dtype == "fp8"


def test_unknown_kv_cache_dtype_is_an_argparse_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--kv-cache-dtype", "int8"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--kv-cache-dtype" in error and "fp8" in error


def test_lora_dtype_flag_maps_onto_engine_config(capsys):
    assert engine_config(build_parser().parse_args(["serve", "--device", "cpu"])).resolved_lora_dtype == "float32"
    parsed = build_parser().parse_args(["serve", "--device", "cpu", "--lora-dtype", "bfloat16"])
    assert engine_config(parsed).lora_dtype == "bfloat16"
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--lora-dtype", "int8"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--lora-dtype" in error and "bfloat16" in error
