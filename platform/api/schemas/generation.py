"""Request and response bodies of the OpenAI-compatible API (OpenAI's shapes and field names).

Extensions beyond OpenAI, as vLLM and LoRAX spell them: `top_k`,
`stop_token_ids`, `ignore_eos`, `adapter_id`. Unknown request fields are
refused (400 naming the field) rather than silently ignored, so a client
asking for something unsupported (tools, penalties, echo) learns it at once.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic_core import PydanticCustomError

from loraloom.platform.db.pages import Page

# Generated tokens when the client sets no limit: the context left after the prompt, capped here
# so a forgotten max_tokens does not hold a slot for thousands of tokens.
DEFAULT_MAX_TOKENS = 1024


def one_error_for_union(expected: str) -> WrapValidator:
    """Report a value that fits no member of a union as one error ("must be ..."),
    instead of one error per member with pydantic's member tags in the field path."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("union_type", "must be {expected}", {"expected": expected}) from None

    return WrapValidator(validate)


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


T = TypeVar("T")

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
# The `limit` query parameter of the paginated lists: `limit: PageLimit = DEFAULT_PAGE_SIZE`.
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]


class ListObject(BaseModel, Generic[T]):
    """OpenAI's list: `{"object": "list", "data": [...]}`. Subclass it with a name
    (`class ModelList(ListObject[ModelCard])`) so the OpenAPI document names the schema."""

    object: Literal["list"] = "list"
    data: list[T]


class PageObject(ListObject[T], Generic[T]):
    """One page of a cursor-paginated list: pass the last item's cursor as `after` for the next."""

    has_more: bool

    @classmethod
    def of(cls: type[PageT], page: Page[Any], convert: Callable[[Any], Any]) -> PageT:
        data = [convert(item) for item in page.items]
        return cls(data=data, has_more=page.has_more, **cls.cursors(data))

    @classmethod
    def cursors(cls, data: list[T]) -> dict[str, Any]:
        """The fields beyond OpenAI's three that name the page's ends."""
        return {}


PageT = TypeVar("PageT", bound=PageObject[Any])


class IdPageObject(PageObject[T], Generic[T]):
    """A page that also names its first and last items' ids, as OpenAI's files and checkpoints lists do."""

    first_id: str | None
    last_id: str | None

    @classmethod
    def cursors(cls, data: list[T]) -> dict[str, Any]:
        return {"first_id": data[0].id if data else None, "last_id": data[-1].id if data else None}


class StreamOptions(StrictBody):
    include_usage: bool = False


class GenerationRequest(StrictBody):
    """The fields chat and text completions share."""

    model: str = Field(description="The base model's name, `base`, or an adapter name (GET /v1/models lists them).")
    adapter_id: str | None = Field(
        default=None, description="LoRAX-style: the adapter to apply; when set, `model` may name the base."
    )
    max_tokens: int | None = Field(
        default=None, description=f"Default: the context left after the prompt, at most {DEFAULT_MAX_TOKENS}."
    )
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = Field(default=0, description="Extension: sample from the k most likely tokens; 0 or -1 disables.")
    seed: int | None = None
    stop: Annotated[str | list[str] | None, one_error_for_union("a string or a list of strings")] = None
    stop_token_ids: list[int] = Field(default_factory=list, description="Extension: token ids that end generation.")
    ignore_eos: bool = Field(default=False, description="Extension: keep generating past end-of-sequence tokens.")
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported; send several requests for several choices")
        return n

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextContentPart(StrictBody):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Not strict: clients send assistant messages back as they received them,
    # with response-only fields (refusal, annotations) that carry nothing for the prompt.
    model_config = ConfigDict(extra="ignore")

    role: str
    content: Annotated[
        str | list[TextContentPart] | None,
        one_error_for_union("a string or a list of text parts ({'type': 'text', 'text': ...})"),
    ] = None
    name: str | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, description="Preferred over the older `max_tokens`.")
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, description="Alternatives per token; needs `logprobs: true`.")

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, top_logprobs: int | None, info: ValidationInfo) -> int | None:
        if top_logprobs is not None and not info.data.get("logprobs", False):
            raise ValueError("needs logprobs: true")
        return top_logprobs


PromptInput = Annotated[
    str | list[int] | list[str] | list[list[int]],
    one_error_for_union("a string, a list of one string, a list of token ids, or a list of one list of token ids"),
]


class CompletionRequest(GenerationRequest):
    prompt: PromptInput
    logprobs: int | None = Field(
        default=None, description="Return the sampled token's logprob and this many alternatives."
    )

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: PromptInput) -> PromptInput:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("must not be an empty list")
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) and len(prompt) != 1:
            raise ValueError(f"one prompt per request is supported, got {len(prompt)}; send several requests")
        return prompt


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


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


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(BaseModel):
    """Both the whole response and each streamed chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    parent: str | None = Field(description="For an adapter: the base model it applies to.")


class ModelList(ListObject[ModelCard]):
    pass


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def unix_seconds(moment: datetime | None) -> int | None:
    """OpenAI objects carry times as integer Unix seconds (`created_at`, `finished_at`)."""
    return None if moment is None else int(moment.timestamp())
