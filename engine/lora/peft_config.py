"""Reading and checking a PEFT adapter_config.json, and each module's rank and alpha under it.

The config comes from a tenant's upload, so nothing in it is trusted (issue 12):
- the file is bounded in size and in nesting before it is parsed, and must be UTF-8 JSON;
- every field the server uses is type-checked here, and an error names the field (`param`) and the fix,
  instead of a TypeError or a NULL in the database surfacing as a 500;
- rank_pattern / alpha_pattern keys are never run as regular expressions (PEFT does, which let one
  catastrophic key stall the server and "(" answer 500). Only the key forms real PEFT configs use are
  accepted, and they are matched against module names with plain string comparisons.
"""
from __future__ import annotations

import json
import math
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.lora.files import ADAPTER_CONFIG_FILE
from loraloom.engine.lora.peft_selection import ModuleSelection, parse_module_selection

# PEFT's configs are about 1 KB; a rank_pattern naming every projection of an 80-layer model is under 50 KB.
MAX_CONFIG_BYTES = 1024 * 1024
# PEFT nests at most three levels (layer_replication's list of pairs); deeper input would only serve to
# drive json's recursive parser into RecursionError, which is no ValueError and so was a 500.
MAX_CONFIG_DEPTH = 32
# A JSON string (possibly unterminated at the end of the text) or a bracket. No part of the pattern can
# match the same text two ways, so scanning is linear whatever the input.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
_MODULE_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_")
ACCEPTED_KEY_FORMS = (
    "a module name such as 'q_proj', a dotted suffix of one such as 'self_attn.q_proj' or "
    "'layers.3.self_attn.q_proj', or a full name such as 'model.layers.3.self_attn.q_proj', which may start "
    "with '^' to match the full name only"
)

V = TypeVar("V", int, float)


class ModuleLoRA(NamedTuple):
    rank: int
    alpha: float
    rslora: bool
    rank_field: str  # "r" or "rank_pattern": the field an error about this rank names
    alpha_field: str  # "lora_alpha" or "alpha_pattern": the field an error about this scaling names

    @property
    def scaling(self) -> float:
        """What PEFT multiplies lora_B @ lora_A by. Ask only once the rank is known to be in range."""
        return self.alpha / math.sqrt(self.rank) if self.rslora else self.alpha / self.rank


@dataclass(frozen=True)
class ModulePatterns(Generic[V]):
    """rank_pattern or alpha_pattern, its keys checked to be module-name forms and indexed by the name (or
    dotted suffix) they match, so a lookup is a few dict probes however many keys there are."""

    entries: dict[tuple[bool, str], tuple[int, V]]  # (anchored with '^', name) -> (position in the config, value)

    def lookup(self, module_name: str) -> V | None:
        """PEFT's rule: the first key, in the config's order, equal to the module's full name or to a dotted
        suffix of it ("q_proj", "self_attn.q_proj", ...); a '^' key matches the full name only."""
        parts = module_name.split(".")
        candidates = [(True, module_name)] + [(False, ".".join(parts[start:])) for start in range(len(parts))]
        hits = [self.entries[candidate] for candidate in candidates if candidate in self.entries]
        return min(hits)[1] if hits else None


@dataclass(frozen=True)
class PeftLoRAConfig:
    """The adapter_config.json fields the server uses, checked."""

    r: int
    lora_alpha: float
    use_rslora: bool
    rank_pattern: ModulePatterns[int]
    alpha_pattern: ModulePatterns[float]
    base_model: str | None  # base_model_name_or_path, if it names one
    selection: ModuleSelection  # target_modules, layers_to_transform, layers_pattern

    def module_lora(self, module_name: str) -> ModuleLoRA:
        """Rank, alpha and scaling of the module named like "model.layers.3.self_attn.q_proj"."""
        rank = self.rank_pattern.lookup(module_name)
        alpha = self.alpha_pattern.lookup(module_name)
        return ModuleLoRA(
            rank=self.r if rank is None else rank,
            alpha=self.lora_alpha if alpha is None else alpha,
            rslora=self.use_rslora,
            rank_field="r" if rank is None else "rank_pattern",
            alpha_field="lora_alpha" if alpha is None else "alpha_pattern",
        )


def read_peft_config(directory: Path) -> PeftLoRAConfig:
    path = directory / ADAPTER_CONFIG_FILE
    if not path.is_file():
        raise AdapterLoadError(f"adapter: {path} not found; a PEFT adapter directory holds {ADAPTER_CONFIG_FILE}",
                               param=ADAPTER_CONFIG_FILE)
    with path.open("rb") as file:
        return parse_peft_config(file.read(MAX_CONFIG_BYTES + 1))  # one byte more tells it is too large


def parse_peft_config(data: bytes) -> PeftLoRAConfig:
    """Check the bytes of an adapter_config.json; raise AdapterLoadError naming the field at fault."""
    config = _json_object(data)
    _refuse_unsupported(config)
    base_model = config.get("base_model_name_or_path")
    return PeftLoRAConfig(
        r=_positive(config.get("r"), "field 'r'", "the rank the adapter was trained with, such as 8",
                    param="r", integer=True),
        lora_alpha=_positive(config.get("lora_alpha"), "field 'lora_alpha'",
                             "the alpha the adapter was trained with, such as 16", param="lora_alpha"),
        use_rslora=_flag(config, "use_rslora"),
        rank_pattern=_patterns(config, "rank_pattern", ("rank", 8), integer=True),
        alpha_pattern=_patterns(config, "alpha_pattern", ("alpha", 16), integer=False),
        base_model=base_model if isinstance(base_model, str) and base_model else None,
        selection=parse_module_selection(config),
    )


def _json_object(data: bytes) -> dict[str, Any]:
    def refuse(problem: str) -> AdapterLoadError:
        return AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} {problem}", param=ADAPTER_CONFIG_FILE)

    if len(data) > MAX_CONFIG_BYTES:
        raise refuse(f"is larger than {MAX_CONFIG_BYTES} bytes; a PEFT adapter config is a few KB, "
                     "upload the one save_pretrained wrote")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise refuse(f"is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start}); "
                     "save it as UTF-8 JSON, as PEFT's save_pretrained does") from None
    if _nested_deeper_than(text, MAX_CONFIG_DEPTH):
        raise refuse(f"is nested more than {MAX_CONFIG_DEPTH} levels deep; a PEFT adapter config nests a few "
                     "levels at most, upload the one save_pretrained wrote")
    try:
        config = json.loads(text)
    except ValueError as error:  # JSONDecodeError, and integers past Python's digit limit
        raise refuse(f"is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise refuse("must hold a JSON object")
    return config


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether brackets outside JSON strings nest deeper than `limit` (stops counting once they do)."""
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        char = text[token.start()]
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _refuse_unsupported(config: dict[str, Any]) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterLoadError(f"adapter: peft_type is {config['peft_type']!r}; only LoRA adapters ('LORA') are "
                               "served", param="peft_type")
    if config.get("modules_to_save"):
        raise AdapterLoadError(
            f"adapter: modules_to_save {config['modules_to_save']} is not supported: loraloom serves one shared "
            "base, so an adapter may carry only LoRA weights; retrain without modules_to_save",
            param="modules_to_save",
        )
    if config.get("use_dora"):
        raise AdapterLoadError("adapter: use_dora is set; DoRA adapters are not supported, retrain with "
                               "use_dora=False", param="use_dora")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise AdapterLoadError("adapter: LoRA bias terms are not supported; retrain with bias='none' and "
                               "lora_bias=False", param="bias" if config.get("bias", "none") != "none" else "lora_bias")


def _positive(value: Any, what: str, example: str, *, param: str, integer: bool = False) -> Any:
    """`value` if it is a positive integer (integer=True) or a positive number a float can hold (returned as
    a float); `what` names it in the message, `example` says what it should be."""
    valid = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0  # NaN > 0 is false
    # Python compares an int with a float exactly, so an integer past float's range is caught, not overflowed.
    valid = valid and (isinstance(value, int) if integer else value <= sys.float_info.max)
    if not valid:
        kind = "a positive integer" if integer else "a positive finite number"
        raise AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} {what} must be {kind}, {example}; "
                               f"got {_shown(value)}", param=param)
    return value if integer else float(value)


def _flag(config: dict[str, Any], field: str) -> bool:
    value = config.get(field)
    if value is not None and not isinstance(value, bool):
        raise AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} field {field!r} must be true or false, got "
                               f"{_shown(value)}", param=field)
    return bool(value)


def _patterns(config: dict[str, Any], field: str, sample: tuple[str, int], *, integer: bool) -> ModulePatterns:
    """`field` (rank_pattern or alpha_pattern) checked and indexed; `sample` is a (noun, value) for messages."""
    noun, value_example = sample
    patterns = config.get(field) or {}  # PEFT writes {} when unused; null and a missing field mean the same
    if not isinstance(patterns, dict):
        raise AdapterLoadError(
            f"adapter: {ADAPTER_CONFIG_FILE} field {field!r} must be a JSON object mapping module names to "
            f"{noun}s, such as {{\"q_proj\": {value_example}}}; got {_shown(patterns)}", param=field
        )
    entries: dict[tuple[bool, str], tuple[int, Any]] = {}
    for position, (key, value) in enumerate(patterns.items()):
        anchored = key.startswith("^")
        name = key[1:] if anchored else key
        if not all(part and set(part) <= _MODULE_NAME_CHARS for part in name.split(".")):
            raise AdapterLoadError(
                f"adapter: {ADAPTER_CONFIG_FILE} field {field!r} has the key {_shown(key)}, which is not a module "
                f"name: keys are matched as module names, never run as regular expressions; use {ACCEPTED_KEY_FORMS}",
                param=field,
            )
        checked = _positive(value, f"field {field!r} key {_shown(key)}",
                            f"the {noun} of the modules the key matches, such as {value_example}",
                            param=field, integer=integer)
        entries.setdefault((anchored, name), (position, checked))
    return ModulePatterns(entries)


def _shown(value: Any) -> str:
    """A value for a message, as JSON (what the uploader wrote), shortened: one field can hold a megabyte."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"
