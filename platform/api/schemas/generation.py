"""What chat and text completions share: the request fields (sampling, streaming, the adapter)
and the usage and logprob shapes of their responses. OpenAI's shapes and field names.

Extensions beyond OpenAI, as vLLM and LoRAX spell them: `top_k`,
`stop_token_ids`, `ignore_eos`, `adapter_id`. Unknown request fields are
refused (400 naming the field) rather than silently ignored, so a client
asking for something unsupported (tools, penalties, echo) learns it at once.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from loraloom.platform.api.schemas.common import StrictBody, one_error_for_union

# Generated tokens when the client sets no limit: the context left after the prompt, capped here
# so a forgotten max_tokens does not hold a slot for thousands of tokens.
DEFAULT_MAX_TOKENS = 1024


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


