"""A chat request's conversation as its chat template gets it, tools included.

A template that renders `tools` (Llama 3.1's, Hermes') gets them, and the history's tool calls with
their arguments as objects, as Hugging Face templates expect. One that does not (the bundled
SmolLM2's) gets the tools described in the system message, and past calls written in the family's
format into the assistant's text, so the model sees its own calls as it would have written them.
"""
from __future__ import annotations

import json
from typing import Any

from loraloom.engine import ChatTemplateError
from loraloom.platform.api.tools.formats import ToolCall, ToolFormat


def template_input(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    describe_tools: bool,
    renders_tools: bool,
    tool_format: ToolFormat,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the template. `describe_tools`: whether the model is told about the tools
    at all (not with tool_choice "none" on a template that does not render them)."""
    if renders_tools:
        return [_with_argument_objects(message, index) for index, message in enumerate(messages)], tools
    rendered = [_with_calls_written(message, index, tool_format) for index, message in enumerate(messages)]
    if tools and describe_tools:
        rendered = _with_system_text(rendered, tool_format.instructions(json.dumps(tools, ensure_ascii=False)))
    return rendered, None


def _calls(message: dict[str, Any], index: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each of the message's tool calls with its arguments parsed (they must be a JSON object)."""
    calls = []
    for call_index, call in enumerate(message.get("tool_calls") or []):
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ChatTemplateError(f"messages[{index}].tool_calls[{call_index}].function.arguments",
                                    "must be the text of a JSON object, as the call was returned")
        calls.append((call, arguments))
    return calls


def _with_argument_objects(message: dict[str, Any], index: int) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    tool_calls = [{**call, "function": {**call["function"], "arguments": arguments}}
                  for call, arguments in _calls(message, index)]
    return {**message, "tool_calls": tool_calls}


def _with_calls_written(message: dict[str, Any], index: int, tool_format: ToolFormat) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    written = tool_format.write([ToolCall(call["function"]["name"], json.dumps(arguments, ensure_ascii=False))
                                 for call, arguments in _calls(message, index)])
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "\n".join(part["text"] for part in content)
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return {**rest, "content": f"{content}\n{written}" if content else written}


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` after the first system message's content, or as a system message of its own."""
    first = messages[0]
    if first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
