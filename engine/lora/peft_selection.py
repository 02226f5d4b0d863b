"""Which modules a PEFT adapter_config.json selects, exactly as PEFT selects them when it wraps a model
(peft.tuners.tuners_utils.check_target_module_exists): `target_modules` as a list (a module's full name,
or a name it ends with after a dot) or as one regular expression (full match of the full name; PEFT
allows no layers_to_transform with it), `layers_to_transform` (an int or a list) with
`layers_pattern` (the name of the layer list, such as "layers").

PEFT applies the weights of selected modules only; a weight in the file for a module the config does not
select is refused by the loader (engine/lora/weights.py) rather than applied.

The regular expression comes from a tenant's upload and runs with the interpreter lock held: it is
bounded in length and refused if it repeats a group that itself repeats or alternates (the shapes whose
backtracking grows exponentially); the names it is matched against are a few dozen characters.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Any

from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.lora.files import ADAPTER_CONFIG_FILE, LORA_MODULE_PARENTS

MAX_TARGET_REGEX_CHARS = 1024
# PEFT's shorthand for every linear layer but the output layer: on a Llama model, the seven projections.
ALL_LINEAR = "all-linear"
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, getattr(sre_constants, "POSSESSIVE_REPEAT", None))


@dataclass(frozen=True)
class ModuleSelection:
    """adapter_config.json's target_modules, layers_to_transform and layers_pattern, checked."""

    target_names: frozenset[str] | None  # a list's entries; None: a regex, or no target_modules at all
    target_regex: re.Pattern[str] | None
    layers: frozenset[int] | None  # layers_to_transform; None: every layer
    layers_patterns: tuple[str, ...]  # layers_pattern; empty: any "<name>.<index>." in the module's name

    def selects(self, module_name: str) -> bool:
        """Whether PEFT would put LoRA on the module of this full name ("model.layers.3.self_attn.q_proj")."""
        if self.target_regex is not None:
            return self.target_regex.fullmatch(module_name) is not None
        if self.target_names is not None and not (
            module_name in self.target_names
            or any(module_name.endswith("." + target) for target in self.target_names)
        ):
            return False
        if self.layers is None:
            return True
        layer = self._layer_index(module_name)
        return layer is not None and layer in self.layers

    def _layer_index(self, module_name: str) -> int | None:
        # PEFT's rule, without running the patterns as regular expressions: the layer index is the number
        # after the last "<pattern>." (any name when no pattern is set) that is followed by another dot.
        parts = module_name.split(".")
        for position in range(len(parts) - 2, 1, -1):
            if parts[position].isdecimal() and (not self.layers_patterns or parts[position - 1] in self.layers_patterns):
                return int(parts[position])
        return None

    def describe(self) -> str:
        """The fields that select, for messages."""
        if self.target_regex is not None:
            return f"target_modules {self.target_regex.pattern!r}"
        words = [f"target_modules {sorted(self.target_names)}" if self.target_names is not None else ""]
        if self.layers is not None:
            words.append(f"layers_to_transform {sorted(self.layers)}")
        if self.layers_patterns:
            words.append(f"layers_pattern {list(self.layers_patterns)}")
        return ", ".join(word for word in words if word) or "no target_modules"


def parse_module_selection(config: dict[str, Any]) -> ModuleSelection:
    """Check the three fields; raise AdapterLoadError naming the one at fault."""
    targets = config.get("target_modules")
    names: frozenset[str] | None = None
    regex: re.Pattern[str] | None = None
    if targets == ALL_LINEAR:
        names = frozenset(LORA_MODULE_PARENTS)
    elif isinstance(targets, str):
        regex = _checked_regex(targets)
    elif isinstance(targets, list) and all(isinstance(target, str) and target for target in targets) and targets:
        names = frozenset(targets)
    elif targets is not None:
        raise _refuse("target_modules", f"must be a list of module names such as [\"q_proj\", \"v_proj\"], or one "
                      f"regular expression matching full module names; got {_shown(targets)}")
    layers = config.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and not (isinstance(layers, list) and all(
            isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in layers)):
        raise _refuse("layers_to_transform", f"must be a layer index or a list of them, such as [0, 1]; "
                      f"got {_shown(layers)}")
    patterns = config.get("layers_pattern")
    if isinstance(patterns, str):
        patterns = [patterns] if patterns else []
    if patterns is not None and not (isinstance(patterns, list) and all(
            isinstance(p, str) and p and "." not in p for p in patterns)):
        raise _refuse("layers_pattern", f"must name the model's list of layers, such as \"layers\"; got {_shown(patterns)}")
    # PEFT's LoraConfig refuses these two combinations, so no adapter it saved has them.
    if regex is not None and layers is not None:
        raise _refuse("layers_to_transform", "cannot be used when target_modules is a regular expression (PEFT "
                      "refuses it too); put the layers in the expression, or list the module names")
    if patterns and not layers:
        raise _refuse("layers_pattern", "needs layers_to_transform, the layer indices it finds (PEFT refuses it "
                      "too); set layers_to_transform or leave layers_pattern out")
    return ModuleSelection(
        target_names=names,
        target_regex=regex,
        # PEFT treats an empty list as no restriction.
        layers=frozenset(layers) if layers else None,
        layers_patterns=tuple(patterns or ()),
    )


def _checked_regex(pattern: str) -> re.Pattern[str]:
    if len(pattern) > MAX_TARGET_REGEX_CHARS:
        raise _refuse("target_modules", f"is a regular expression of {len(pattern)} characters; at most "
                      f"{MAX_TARGET_REGEX_CHARS} are accepted, or list the module names instead")
    try:
        parsed = sre_parser.parse(pattern)
    except re.error as error:
        raise _refuse("target_modules", f"is not a valid regular expression ({error}); list the module names "
                      "instead, such as [\"q_proj\", \"v_proj\"]") from None
    if _nested_repeat(parsed, inside_repeat=False):
        raise _refuse("target_modules", f"{_shown(pattern)} repeats a group that itself repeats or alternates, "
                      "which can take exponential time to match; write it without nesting (such as "
                      "'.*\\.(q_proj|v_proj)') or list the module names")
    return re.compile(pattern)


def _nested_repeat(items: Any, *, inside_repeat: bool) -> bool:
    """Whether a repetition of more than one holds another repetition or an alternation (sre's parse tree)."""
    for op, argument in items:
        if op in _REPEATS and op is not None:
            _, high, body = argument
            repeats = high is sre_constants.MAXREPEAT or high > 1
            if repeats and inside_repeat:
                return True
            if _nested_repeat(body, inside_repeat=inside_repeat or repeats):
                return True
        elif op is sre_constants.BRANCH:
            if inside_repeat:
                return True
            if any(_nested_repeat(branch, inside_repeat=False) for branch in argument[1]):
                return True
        elif op in (sre_constants.SUBPATTERN, sre_constants.ATOMIC_GROUP, sre_constants.ASSERT,
                    sre_constants.ASSERT_NOT):
            body = argument[-1]
            if _nested_repeat(body, inside_repeat=inside_repeat):
                return True
    return False


def _refuse(field: str, problem: str) -> AdapterLoadError:
    return AdapterLoadError(f"adapter: {ADAPTER_CONFIG_FILE} field {field!r} {problem}", param=field)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"
