"""POST /v1/chat/completions: the request, the response and its streamed chunks (OpenAI's shapes)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo, field_validator

from loraloom.engine import MAX_TOP_LOGPROBS
from loraloom.platform.api.schemas.common import StrictBody, documented_bounds, one_error_for_union
from loraloom.platform.api.schemas.generation import (
    GenerationRequest,
    TopLogprob,
    Unsupported,
    Usage,
    refuse_unsupported,
)
from loraloom.platform.api.schemas.ignored_fields import IgnoredChatFields, MetadataField
from loraloom.platform.api.tools.request import MAX_TOOLS, ToolChoice, ToolDefinition, check_tools
from loraloom.platform.api.tools.shapes import ToolCallDelta, ToolCallItem


class TextContentPart(StrictBody):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Not strict: clients send assistant messages back as they received them,
    # with response-only fields (refusal, annotations) that carry nothing for the prompt.
    model_config = ConfigDict(extra="ignore")

    role: str = Field(description="system, developer (OpenAI's newer name for system, rendered as system), "
                                  "user, assistant or tool.")
    content: Annotated[
        str | list[TextContentPart] | None,
        one_error_for_union("a string or a list of text parts ({'type': 'text', 'text': ...})"),
    ] = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = Field(default=None, description="An assistant turn's calls, as returned.")
    tool_call_id: str | None = Field(default=None, description="A tool message: the call it answers.")


class ChatCompletionRequest(GenerationRequest, IgnoredChatFields, MetadataField):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1,
                                                    description="Preferred over the older `max_tokens`.")
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description=f"Alternatives per token, at most {MAX_TOP_LOGPROBS}; needs `logprobs: true`.",
    )
    tools: list[ToolDefinition] | None = Field(
        default=None, description="Functions the model may call.",
        json_schema_extra=documented_bounds(array={"minItems": 1, "maxItems": MAX_TOOLS}))
    tool_choice: ToolChoice | None = Field(
        default=None, description="none: never call; auto (the default with tools): the model decides, and its calls "
        "are parsed; required: at least one call; {\"type\": \"function\", \"function\": {\"name\": ...}}: that "
        "function. required and named calls are constrained to the model's call format and each function's schema.",
    )
    parallel_tool_calls: StrictBool = Field(default=True, description="false: at most one call per answer.")
    functions: Unsupported
    function_call: Unsupported
    audio: Unsupported
    prediction: Unsupported
    web_search_options: Unsupported

    _refuse_unsupported = field_validator(
        "functions", "function_call", "audio",
        "prediction", "web_search_options",
    )(refuse_unsupported)

    _tools_list = field_validator("tools")(check_tools)

    @property
    def max_tokens_field(self) -> str:
        """max_completion_tokens supersedes the older max_tokens; errors name the one the client used."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def engine_logprobs(self) -> int | None:
        """The engine's logprobs: None without `logprobs: true`, else the alternatives asked for (0: none)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def request_field(self, engine_field: str) -> str:
        """The engine's prompt is the messages; its max_tokens whichever of the two fields the client set."""
        if engine_field == "prompt":
            return "messages"
        if engine_field == "max_tokens":
            return self.max_tokens_field
        return engine_field

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, top_logprobs: int | None, info: ValidationInfo) -> int | None:
        if top_logprobs is not None and not info.data.get("logprobs", False):
            raise ValueError("needs logprobs: true")
        return top_logprobs


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # OpenAI leaves tool_calls out of a message that made no calls.
    tool_calls: list[ToolCallItem] | None = Field(default=None, exclude_if=lambda value: value is None)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    # OpenAI leaves out what a chunk does not carry: the role only in the first, nothing in the last.
    role: Literal["assistant"] | None = Field(default=None, exclude_if=lambda value: value is None)
    content: str | None = Field(default=None, exclude_if=lambda value: value is None)
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=lambda value: value is None)


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
