"""Model families' tool-call formats, in a registry that the server (`serve --tool-parser`) or an
adapter (adapter_config.json's `tool_parser`, else its own chat template) chooses from.

A format knows four things about its family: how a call is written (so `required` and named calls
can be constrained to it by a Lark grammar whose arguments are the function's JSON schema), how to
read calls back out of free text (`auto`), how to write past calls into the history, and how to
describe the tools in a system prompt when the chat template does not render them itself.

- smollm2: `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>` (SmolLM2's model card).
- hermes: one `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` block per call (Hermes, Qwen).
- llama3_json: `{"name": ..., "parameters": {...}}`, calls separated by "; " (Llama 3.1's JSON calls),
  optionally after `<|python_tag|>`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# auto and one name per format of TOOL_FORMATS below; declared in settings.py, where the layers below (the registry
# checking an adapter's tool_parser) can read them.
from loraloom.platform.settings import TOOL_PARSER_CHOICES

# Calls per answer that a grammar allows when parallel calls are on: a small model, once constrained,
# may otherwise repeat calls until max_tokens.
MAX_PARALLEL_CALLS = 4
# JSON as models write it (the same options as response_format's grammar, engine/structured_output.py).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_DEFINITIONS = ("$defs", "definitions")


@dataclass(frozen=True)
class Function:
    """A function the request offers: its name, description and JSON schema of its arguments."""

    name: str
    description: str | None
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it


@dataclass(frozen=True)
class Parsed:
    """A choice's text read as tool calls: the text before them (None if none), and the calls."""

    content: str | None
    calls: list[ToolCall]


class ToolFormat:
    """One family's format. Subclasses set the markers and the key of the arguments object."""

    name: str
    arguments_key = "arguments"
    # Where calls begin in free text; content before it is the message's content.
    start_marker: str

    # --- constrained calls ------------------------------------------------------------------------

    def grammar(self, functions: list[Function], parallel: bool) -> str:
        """A Lark grammar for one call (or up to MAX_PARALLEL_CALLS) of any of `functions`."""
        alternatives = " | ".join(f"call_{index}" for index in range(len(functions)))
        rules = [f"call_{index}: %json {json.dumps(self._call_schema(function))}"
                 for index, function in enumerate(functions)]
        parts = [_literal(self.opening), "call"]
        if parallel:
            parts.append(f"({_literal(self.separator)} call){{0,{MAX_PARALLEL_CALLS - 1}}}")
        parts.append(_literal(self.closing))
        start = "start: " + " ".join(part for part in parts if part)
        return "\n".join([start, f"call: {alternatives}", *rules])

    def _call_schema(self, function: Function) -> dict[str, Any]:
        # The parameters' definitions move to the root: their "#/$defs/..." references are written
        # against the parameters' schema, which is the call schema's root here.
        parameters = {key: value for key, value in function.parameters.items() if key not in _DEFINITIONS}
        definitions = {key: function.parameters[key] for key in _DEFINITIONS if key in function.parameters}
        return {
            "type": "object",
            "properties": {"name": {"const": function.name}, self.arguments_key: parameters},
            "required": ["name", self.arguments_key],
            "additionalProperties": False,
            "x-guidance": _JSON_STYLE,
            **definitions,
        }

    # How calls are laid out around their JSON objects: opening, separator between calls, closing.
    opening = ""
    separator = ""
    closing = ""

    # --- writing and reading ----------------------------------------------------------------------

    def write(self, calls: list[ToolCall]) -> str:
        """Past calls as the model would have written them (for templates that do not render tool_calls)."""
        objects = [json.dumps({"name": call.name, self.arguments_key: json.loads(call.arguments)},
                              ensure_ascii=False) for call in calls]
        return self.opening + self.separator.join(objects) + self.closing

    def parse(self, text: str, known: set[str]) -> Parsed:
        """Calls in `text` to functions in `known`; anything else (no calls, malformed ones, unknown
        names) leaves the whole text as content, as a model that did not call would have written it."""
        start = self.find_start(text)
        if start < 0:
            return Parsed(text, [])
        calls = self._read_calls(text[start:])
        if not calls or any(call.name not in known for call in calls):
            return Parsed(text, [])
        return Parsed(text[:start].strip() or None, calls)

    def find_start(self, text: str) -> int:
        return text.find(self.start_marker)

    def hold_from(self, text: str) -> int:
        """Where a stream must hold content back: a tail of `text` that may begin the start marker."""
        for length in range(min(len(self.start_marker) - 1, len(text)), 0, -1):
            if text.endswith(self.start_marker[:length]):
                return len(text) - length
        return len(text)

    def _read_calls(self, text: str) -> list[ToolCall] | None:
        raise NotImplementedError

    def _call(self, value: Any) -> ToolCall | None:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get(self.arguments_key, value.get("arguments", value.get("parameters", {})))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))

    def instructions(self, tools_json: str) -> str:
        """A system prompt offering the tools, for a template that does not render `tools`."""
        example = self.write([ToolCall("function_name", '{"argument": "value"}')])
        return (
            "You can call functions. These are available, as JSON schemas:\n"
            f"<tools>{tools_json}</tools>\n"
            "To call one or more of them, answer with nothing but the calls, written like this:\n"
            f"{example}\n"
            "Otherwise answer normally."
        )


class SmolLM2Format(ToolFormat):
    name = "smollm2"
    start_marker = "<tool_call>"
    opening = "<tool_call>["
    separator = ", "
    closing = "]</tool_call>"

    def _read_calls(self, text: str) -> list[ToolCall] | None:
        match = re.match(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
        if match is None:
            return None
        try:
            value = json.loads(match.group(1))
        except ValueError:
            return None
        values = value if isinstance(value, list) else [value]
        calls = [self._call(item) for item in values]
        return None if None in calls else calls


class HermesFormat(ToolFormat):
    name = "hermes"
    start_marker = "<tool_call>"
    opening = "<tool_call>\n"
    separator = "\n</tool_call>\n<tool_call>\n"
    closing = "\n</tool_call>"

    def _read_calls(self, text: str) -> list[ToolCall] | None:
        blocks = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
        calls = []
        for block in blocks:
            try:
                calls.append(self._call(json.loads(block)))
            except ValueError:
                return None
        return None if None in calls else calls


class Llama3JsonFormat(ToolFormat):
    """Llama 3.1 answers a call with nothing but its JSON: calls are recognised only at the start."""

    name = "llama3_json"
    arguments_key = "parameters"
    start_marker = "{"
    separator = "; "
    python_tag = "<|python_tag|>"

    def find_start(self, text: str) -> int:
        stripped = text.lstrip()
        if stripped.startswith(self.python_tag) or stripped.startswith("{"):
            return len(text) - len(stripped)
        return -1

    def hold_from(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or self.python_tag.startswith(stripped):
            return 0  # undecided: the answer may still begin with a call
        return len(text)

    def _read_calls(self, text: str) -> list[ToolCall] | None:
        text = text.strip().removeprefix(self.python_tag).strip()
        decoder = json.JSONDecoder()
        calls, position = [], 0
        while position < len(text):
            try:
                value, position = decoder.raw_decode(text, position)
            except ValueError:
                return None
            calls.append(self._call(value))
            position = len(text) - len(text[position:].lstrip().removeprefix(";").lstrip())
        return None if None in calls else calls


TOOL_FORMATS: dict[str, ToolFormat] = {
    format.name: format for format in (SmolLM2Format(), HermesFormat(), Llama3JsonFormat())
}
AUTO = "auto"


def format_for_template(template: str | None) -> ToolFormat:
    """The family a chat template belongs to, read from the markers it writes: Llama 3's header
    tokens, Hermes' <tool_call> blocks; SmolLM2's ChatML otherwise (the bundled model's)."""
    source = template or ""
    if "<|start_header_id|>" in source or "<|python_tag|>" in source:
        return TOOL_FORMATS["llama3_json"]
    if "<tool_call>\\n" in source or "<tool_call>\n" in source:
        return TOOL_FORMATS["hermes"]
    return TOOL_FORMATS["smollm2"]


def choose_format(parser: str | None, template: str | None) -> ToolFormat:
    """`parser` (a registry name, or auto/None: from the template) picks the format."""
    if parser is None or parser == AUTO:
        return format_for_template(template)
    if parser not in TOOL_FORMATS:
        raise ValueError(f"tool parser {parser!r} is not one of {', '.join(TOOL_PARSER_CHOICES)}")
    return TOOL_FORMATS[parser]


def _literal(text: str) -> str:
    """`text` as a Lark string literal; nothing for no text."""
    return json.dumps(text) if text else ""
