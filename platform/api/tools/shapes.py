"""OpenAI's tool-call shapes in messages (request history and response) and in streamed deltas."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as a JSON object's text.")


class ToolCallItem(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    # The first delta of a call carries its name and empty arguments; the next ones argument fragments only.
    name: str | None = Field(default=None, exclude_if=lambda value: value is None)
    arguments: str


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = Field(default=None, exclude_if=lambda value: value is None)
    type: Literal["function"] | None = Field(default=None, exclude_if=lambda value: value is None)
    function: FunctionCallDelta
