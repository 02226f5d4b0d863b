"""The served model's own sampling defaults, from its generation_config.json, as vLLM applies them:
what a request leaves out (temperature, top_p, top_k, repetition penalty, max tokens) comes from the
model's authors rather than from 1.0, which makes small instruct models ramble."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from loraloom.engine.request import MAX_TEMPERATURE

GENERATION_CONFIG_FILE = "generation_config.json"
# "auto": the model directory's generation_config.json; "none": the server's built-in defaults only.
GENERATION_CONFIG_SOURCES = ("auto", "none")


@dataclass(frozen=True)
class GenerationDefaults:
    """Values the model's authors chose; None where they chose nothing (the server's default applies)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None  # generation_config.json's max_new_tokens

    def chosen(self) -> dict[str, float | int]:
        """Only what the model sets, as the request fields it fills in."""
        return {name: value for name, value in asdict(self).items() if value is not None}


# generation_config.json's key -> (our field, the type it must have)
_KEYS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "repetition_penalty": ("repetition_penalty", float),
    "max_new_tokens": ("max_tokens", int),
}


# Our field -> (is the value in range, the range in words): the ranges a request's own value must be in
# (platform/api/schemas/generation.py states the same bounds), since a default stands in for that value.
_RANGES = {
    "temperature": (lambda value: 0 <= value <= MAX_TEMPERATURE, f"between 0 and {MAX_TEMPERATURE:g}"),
    "top_p": (lambda value: 0 < value <= 1, "above 0 and at most 1"),
    "top_k": (lambda value: value >= -1, "-1, 0 (off) or a positive count"),
    "repetition_penalty": (lambda value: value > 0, "above 0"),
    "max_tokens": (lambda value: value >= 1, "at least 1"),
}


def read_generation_defaults(model_dir: Path, source: str = "auto") -> GenerationDefaults:
    """The defaults `source` names (GENERATION_CONFIG_SOURCES). A value of the wrong type is an error
    naming the file and key: serving on with it silently dropped would answer differently than its authors meant."""
    if source not in GENERATION_CONFIG_SOURCES:
        raise ValueError(f"generation_config is {source!r}; use one of {list(GENERATION_CONFIG_SOURCES)}")
    path = Path(model_dir) / GENERATION_CONFIG_FILE
    if source == "none" or not path.is_file():
        return GenerationDefaults()
    config = json.loads(path.read_text())
    values: dict[str, float | int] = {}
    for key, (field_name, kind) in _KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        # bool is an int in Python, and an int is a fine float; a string or a bool is not a sampling value.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ValueError(f"{path}: {key} is {value!r}; it must be a number ({kind.__name__}) or absent")
        in_range, words = _RANGES[field_name]
        if not math.isfinite(value) or not in_range(value):
            raise ValueError(f"{path}: {key} is {value!r}; it must be {words}, or absent "
                             "(or serve with --generation-config none)")
        values[field_name] = kind(value)
    return GenerationDefaults(**values)
