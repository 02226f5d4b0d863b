"""The tool fields of a chat request (OpenAI's shapes), and what they ask for as one ToolRequest."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, field_validator

from loraloom.engine import RequestFieldError
from loraloom.platform.api.schemas.common import StrictBody, one_error_for_union
from loraloom.platform.api.tools.formats import NO_PARAMETERS, Function

# OpenAI's limits: 128 tools per request, names of 64 letters, digits, underscores or dashes.
MAX_TOOLS = 128
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# All tools' JSON schemas together: they are compiled into one grammar for `required` calls.
MAX_TOOLS_SCHEMA_BYTES = 64 * 1024


class FunctionDefinition(StrictBody):
    name: str = Field(description="1 to 64 letters, digits, underscores or dashes.")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="JSON schema of the arguments object; none: the function takes no arguments."
    )
    strict: StrictBool | None = Field(
        default=None, description="Accepted for compatibility: `required` and named calls always follow the schema."
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        if not _FUNCTION_NAME.fullmatch(name):
            raise ValueError(f"must be 1 to 64 letters, digits, underscores or dashes, got {name!r}")
        return name

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ValueError("must be the JSON schema of an object (\"type\": \"object\"): arguments are an object")
        return parameters


class ToolDefinition(StrictBody):
    type: Literal["function"] = Field(description="Only function tools are offered.")
    function: FunctionDefinition


class NamedFunction(StrictBody):
    name: str


class NamedToolChoice(StrictBody):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice,
    one_error_for_union('"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
]


def check_tools(tools: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
    """The whole list's rules (each tool's own are its model's): a bounded count, unique names, bounded schemas."""
    if tools is None:
        return None
    if not 1 <= len(tools) <= MAX_TOOLS:
        raise ValueError(f"must list 1 to {MAX_TOOLS} tools, got {len(tools)}; leave tools out for none")
    names = [tool.function.name for tool in tools]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"function names must be unique; {repeated[0]!r} is defined more than once")
    size = len(json.dumps([tool.function.parameters for tool in tools], default=str))
    if size > MAX_TOOLS_SCHEMA_BYTES:
        raise ValueError(f"the functions' parameters are {size} bytes of JSON together; at most "
                         f"{MAX_TOOLS_SCHEMA_BYTES} are accepted")
    return tools


@dataclass(frozen=True)
class ToolRequest:
    """What a request's tool fields ask for. mode: none (tools only shown), auto (the model may call;
    calls are parsed), required (at least one call, constrained), named (that function, constrained)."""

    functions: list[Function]
    mode: Literal["none", "auto", "required", "named"]
    parallel: bool

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def names(self) -> set[str]:
        return {function.name for function in self.functions}


def tool_request(
    tools: list[ToolDefinition] | None, tool_choice: str | NamedToolChoice | None, parallel_tool_calls: bool
) -> ToolRequest | None:
    """None when the request offers no tools. Raises RequestFieldError naming tool_choice for a choice
    that does not fit the tools."""
    if not tools:
        if tool_choice is not None and tool_choice != "none":
            raise RequestFieldError("tool_choice", "needs tools; list the functions in tools, or leave tool_choice out")
        return None
    functions = [Function(tool.function.name, tool.function.description, tool.function.parameters or NO_PARAMETERS)
                 for tool in tools]
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [function for function in functions if function.name == tool_choice.function.name]
        if not chosen:
            raise RequestFieldError("tool_choice", f"function {tool_choice.function.name!r} is not in tools; name "
                                    f"one of {', '.join(sorted(function.name for function in functions))}")
        return ToolRequest(chosen, "named", parallel=False)
    return ToolRequest(functions, tool_choice or "auto", parallel=parallel_tool_calls)


def template_tools(tools: list[ToolDefinition]) -> list[dict[str, Any]]:
    """The tools as chat templates expect them (OpenAI's shape, unset fields left out)."""
    return [tool.model_dump(exclude_none=True) for tool in tools]
