"""POST /v1/completions (OpenAI's legacy text completions): one shape for the response and each chunk."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, ValidationInfo, field_validator

from loraloom.engine import MAX_TOP_LOGPROBS
from loraloom.platform.api.schemas.common import JsonInteger, one_error_for_union
from loraloom.platform.api.schemas.generation import GenerationRequest, Unsupported, Usage, refuse_unsupported


PromptInput = Annotated[
    str | list[JsonInteger] | list[str] | list[list[JsonInteger]],
    one_error_for_union("a string, a list of one string, a list of token ids, or a list of one list of token ids"),
]


class CompletionRequest(GenerationRequest):
    prompt: PromptInput
    logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description=f"Return the sampled token's logprob and this many alternatives, at most {MAX_TOP_LOGPROBS}.",
    )
    echo: StrictBool = Field(
        default=False, description="Each choice's text begins with the prompt (for a prompt of token ids: as they "
        "decode); streamed, as the choice's first chunk. Not with `logprobs`."
    )
    best_of: Unsupported
    suffix: Unsupported

    _refuse_unsupported = field_validator("best_of", "suffix")(refuse_unsupported)

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, echo: bool, info: ValidationInfo) -> bool:
        # OpenAI would return the prompt's logprobs too, which the engine does not compute.
        if echo and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs is not supported (the prompt's logprobs are not computed); "
                             "leave out one of them")
        return echo

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: PromptInput) -> PromptInput:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("must not be an empty list")
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) and len(prompt) != 1:
            raise ValueError(f"one prompt per request is supported, got {len(prompt)}; send several requests")
        return prompt


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
