"""What one chat request does about tools: the format its calls take, the conversation its template
gets, the grammar of constrained calls, and how each choice's text becomes the answer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraloom.platform.api.errors import APIError
from loraloom.platform.api.tools.formats import ToolFormat, choose_format
from loraloom.platform.api.tools.prompt import template_input
from loraloom.platform.api.tools.request import ToolDefinition, ToolRequest, template_tools, tool_request
from loraloom.platform.api.tools.results import ToolAnswer, ToolStream, tool_answer


@dataclass(frozen=True)
class ToolPlan:
    request: ToolRequest | None  # None: no tools offered
    format: ToolFormat
    tools: list[dict[str, Any]] | None  # as templates get them

    @property
    def grammar(self) -> str | None:
        """The Lark grammar of `required` and named calls; None when the model answers freely."""
        if self.request is None or not self.request.constrained:
            return None
        return self.format.grammar(self.request.functions, self.request.parallel)

    def template_input(self, messages: list[dict[str, Any]], renders_tools: bool) -> tuple[list[dict], list | None]:
        return template_input(messages, self.tools, renders_tools=renders_tools, tool_format=self.format,
                              describe_tools=self.request is not None and self.request.mode != "none")

    def answer(self, text: str, finish_reason: str | None) -> ToolAnswer:
        return tool_answer(text, finish_reason, self.request, self.format)

    def stream(self) -> ToolStream | None:
        """A choice's stream reader; None when no calls are read (no tools, or tool_choice none)."""
        if self.request is None or self.request.mode == "none":
            return None
        return ToolStream(self.request, self.format)


def plan_tools(
    tools: list[ToolDefinition] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    *,
    wants_json: bool,
    parser: str | None,
    template: str | None,
) -> ToolPlan:
    """Raises RequestFieldError or APIError (a 400 naming the field) for tool fields that do not fit together.
    `parser` is the server's setting, one of the formats' names (settings.py checks it), or "auto"."""
    request = tool_request(tools, tool_choice, parallel_tool_calls)
    tool_format = choose_format(parser, template)
    if request is not None and request.constrained and wants_json:
        raise APIError(400, "response_format: a JSON response_format cannot be combined with a required or named "
                       "tool_choice (the answer is the calls); leave one out", param="response_format")
    return ToolPlan(request, tool_format, template_tools(tools) if tools else None)
