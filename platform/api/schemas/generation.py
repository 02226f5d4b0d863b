"""What chat and text completions share: the request fields (sampling, streaming, the adapter)
and the usage and logprob shapes of their responses. OpenAI's shapes and field names.

Extensions beyond OpenAI, as vLLM and LoRAX spell them: `top_k`,
`stop_token_ids`, `ignore_eos`, `repetition_penalty`, `min_tokens`, `adapter_id`.
Unknown request fields are refused (400 naming the field) rather than silently
ignored, so a client asking for something unsupported learns it at once; OpenAI's fields that
change nothing here are accepted and named in a response header (schemas/ignored_fields.py).
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, ValidationInfo, field_validator
from pydantic.json_schema import SkipJsonSchema

from loraloom.engine import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_TOKENS, MAX_PENALTY, MAX_TEMPERATURE
from loraloom.platform.api.schemas.common import StrictBody, documented_bounds, one_error_for_union

# Generated tokens when the client sets no limit: the context left after the prompt, capped here
# so a forgotten max_tokens does not hold a slot for thousands of tokens.
DEFAULT_MAX_TOKENS = 1024
# Choices per request (`n`): each is an engine request holding its own KV blocks and a batch row.
MAX_CHOICES = 8


# OpenAI request fields this server does not implement, and what to do instead. A request model
# declares the ones of its endpoint as `Unsupported` fields, hidden from the OpenAPI document, only so
# that they are refused with this message and the field in `param` (an unknown field gets pydantic's
# bare "Extra inputs are not permitted").
_NO_TOOLS = "the deprecated function calling fields are not supported; send tools and tool_choice instead"
UNSUPPORTED_FIELDS = {
    "functions": _NO_TOOLS,
    "function_call": _NO_TOOLS,
    "audio": "audio output is not supported: only text is generated; remove it",
    "prediction": "predicted outputs are not supported; remove it",
    "web_search_options": "web search is not supported; remove it",
    "best_of": "best_of is not supported; ask for n choices and pick one yourself",
    "suffix": "suffix (text insertion) is not supported; remove it",
}
Unsupported = Annotated[SkipJsonSchema[Any], Field(default=None, exclude=True)]


def refuse_unsupported(value: Any, info: ValidationInfo) -> Any:
    """The field_validator of a model's `Unsupported` fields: runs only when the client sent one."""
    raise ValueError(UNSUPPORTED_FIELDS[info.field_name])

# Stop strings are searched in every text delta: bounded, so one request cannot make each of its
# steps scan thousands of long strings. (OpenAI allows 4; clients porting from vLLM send more.)
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256

# cache_salt and prompt_cache_key only name a cache scope: bounded, as a key would be, so that what a
# request hashes per KV block stays small.
MAX_CACHE_KEY_CHARS = 256
CACHE_KEY_DESCRIPTION = (
    "Requests of one tenant with different values never share cached prompt blocks; the same value shares them "
    "(as no value does). The cache is never shared across tenants whatever this says. At most "
    f"{MAX_CACHE_KEY_CHARS} characters."
)

# The sampling fields a request may leave out, filled in from the served model's generation_config.json
# (engine/generation_defaults.py; GET /v1/models shows them), as vLLM does.
MODEL_DEFAULT = ("Default: the served model's generation_config.json value (GET /v1/models shows it as "
                 "generation_defaults), else {fallback}.")

# Strict types throughout (StrictInt, StrictBool, StrictFloat): as OpenAI does, "5" is not a
# max_tokens nor "yes" a boolean; pydantic would otherwise coerce them.
# The sampling fields' ranges are checked here, once (the engine checks only what needs the model:
# vocabulary, context length, tokenizer), from the engine's bounds (engine/request.py),
# which the descriptions state too. Numbers are finite: Python's JSON reads NaN and Infinity.
_PENALTY_RANGE = f"Between -{MAX_PENALTY:g} and {MAX_PENALTY:g}"


class StreamOptions(StrictBody):
    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = Field(
        default=None, description="Accepted and ignored: chunks carry no obfuscation padding."
    )


RESPONSE_FORMAT_DESCRIPTION = (
    "`{\"type\": \"text\"}` (the default); `{\"type\": \"json_object\"}`: the output is a JSON object; "
    "`{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}, \"strict\": true}}`: "
    "the output is JSON valid for the schema. Both are enforced token by token, whatever `strict` says; "
    "the output is cut short only by max_tokens or a stop sequence."
)
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def check_response_format(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's response_format shapes, checked here (one param for every fault, the whole field);
    whether a schema can be served is the engine's to say, when it compiles it."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind not in _FORMAT_KEYS:
        raise ValueError(f"type must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}")
    unknown = sorted(set(response_format) - _FORMAT_KEYS[kind])
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} for type {kind!r}")
    if kind != "json_schema":
        return response_format
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("json_schema must be an object with name and schema")
    unknown = sorted(set(spec) - _JSON_SCHEMA_KEYS)
    if unknown:
        raise ValueError(f"json_schema has an unknown field {unknown[0]!r}")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise ValueError("json_schema.name must be 1 to 64 letters, digits, underscores or dashes")
    if not isinstance(spec.get("schema"), dict):
        raise ValueError("json_schema.schema must be a JSON schema object")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise ValueError("json_schema.strict must be a boolean")
    return response_format


class GenerationRequest(StrictBody):
    """The fields chat and text completions share."""

    model: str = Field(description="The base model's name, `base`, or an adapter name (GET /v1/models lists them).")
    adapter_id: str | None = Field(
        default=None, description="LoRAX-style: the adapter to apply; when set, `model` may name the base."
    )
    max_tokens: StrictInt | None = Field(
        default=None, ge=1, description="Default: the context left after the prompt, at most the model's "
        f"generation_config.json max_new_tokens, else at most {DEFAULT_MAX_TOKENS}."
    )
    temperature: StrictFloat | None = Field(
        default=None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False,
        description=f"Between 0 (greedy) and {MAX_TEMPERATURE:g}. " + MODEL_DEFAULT.format(fallback=1),
    )
    top_p: StrictFloat | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False,
        description="Above 0, at most 1 (1 disables it). " + MODEL_DEFAULT.format(fallback=1),
    )
    top_k: StrictInt | None = Field(default=None, ge=-1, description="Extension: sample from the k most likely tokens; "
                                    "0 or -1 disables. " + MODEL_DEFAULT.format(fallback=0))
    seed: StrictInt | None = None
    stop: Annotated[str | list[str] | None, one_error_for_union("a string or a list of strings")] = Field(
        default=None,
        description=f"At most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_STRING_CHARS} characters each.",
        json_schema_extra=documented_bounds(string={"maxLength": MAX_STOP_STRING_CHARS}, array={
            "maxItems": MAX_STOP_STRINGS, "items": {"maxLength": MAX_STOP_STRING_CHARS}}),
    )
    stop_token_ids: list[StrictInt] = Field(
        default_factory=list, description="Extension: token ids that end generation, in the vocabulary."
    )
    ignore_eos: StrictBool = Field(default=False, description="Extension: keep generating past end-of-sequence tokens.")
    presence_penalty: StrictFloat = Field(
        default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False,
        description=f"{_PENALTY_RANGE}: subtracted from the logit of every token already generated.",
    )
    frequency_penalty: StrictFloat = Field(
        default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False,
        description=f"{_PENALTY_RANGE}: subtracted from a token's logit once per time it was generated.",
    )
    repetition_penalty: StrictFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Extension (vLLM): above 0; tokens of the prompt or the output have positive logits divided by it "
        "and negative ones multiplied by it. 1 disables it. " + MODEL_DEFAULT.format(fallback=1),
    )
    logit_bias: dict[str, StrictFloat] | None = Field(
        default=None, description=f"Token id (as a string) -> bias between -{MAX_LOGIT_BIAS:g} and "
        f"{MAX_LOGIT_BIAS:g} added to its logit; at most {MAX_LOGIT_BIAS_TOKENS} tokens. -{MAX_LOGIT_BIAS:g} forbids "
        f"a token, {MAX_LOGIT_BIAS:g} all but forces it.",
        json_schema_extra=documented_bounds(object={
            "maxProperties": MAX_LOGIT_BIAS_TOKENS,
            "additionalProperties": {"type": "number", "minimum": -MAX_LOGIT_BIAS, "maximum": MAX_LOGIT_BIAS}}),
    )
    min_tokens: StrictInt = Field(
        default=0, ge=0, description="Extension (vLLM): end-of-sequence and stop_token_ids are held back until this "
        "many tokens were generated."
    )
    response_format: dict[str, Any] | None = Field(default=None, description=RESPONSE_FORMAT_DESCRIPTION)
    n: StrictInt = Field(default=1, description=f"How many choices to generate, at most {MAX_CHOICES}. They share the "
                   "prompt's computation; with a seed, choice i samples with seed + i.",
                   json_schema_extra=documented_bounds(integer={"minimum": 1, "maximum": MAX_CHOICES}))
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="OpenAI's end-user id. Here it keeps a user on one version of "
                             "an alias split between versions (a canary rollout): the same user gets the same "
                             "version while the split stays the same; without it each request draws one.")
    cache_salt: str | None = Field(default=None, description="Extension (vLLM): isolates this request's prefix "
                                   "cache within the tenant. " + CACHE_KEY_DESCRIPTION,
                                   json_schema_extra=documented_bounds(string={"maxLength": MAX_CACHE_KEY_CHARS}))
    prompt_cache_key: str | None = Field(default=None, description="OpenAI's cache key: isolates this request's "
                                         "prefix cache within the tenant, as cache_salt does. " + CACHE_KEY_DESCRIPTION,
                                         json_schema_extra=documented_bounds(string={"maxLength": MAX_CACHE_KEY_CHARS}))

    @field_validator("cache_salt", "prompt_cache_key")
    @classmethod
    def _bounded_cache_key(cls, value: str | None) -> str | None:
        if value is not None and len(value) > MAX_CACHE_KEY_CHARS:
            raise ValueError(f"at most {MAX_CACHE_KEY_CHARS} characters, got {len(value)}; use a shorter key "
                             "(a hash of a longer one isolates as well)")
        return value

    def engine_cache_salt(self) -> str | None:
        """The engine's per-request salt (Request.cache_salt) from both fields: None when neither is set.
        repr() keeps them apart, so cache_salt "a" and prompt_cache_key "a" are two scopes."""
        if not self.cache_salt and not self.prompt_cache_key:
            return None
        return repr((self.cache_salt or "", self.prompt_cache_key or ""))

    @field_validator("n")
    @classmethod
    def _choices_within_limit(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"must be between 1 and {MAX_CHOICES}, got {n}; send several requests for more choices")
        return n

    _response_format_shape = field_validator("response_format")(check_response_format)

    @property
    def wants_json(self) -> bool:
        return self.response_format is not None and self.response_format["type"] != "text"

    def json_schema(self) -> dict[str, Any] | None:
        """The schema the output must follow; None for any JSON object (json_object). Only when wants_json."""
        if self.response_format["type"] == "json_object":
            return None
        return self.response_format["json_schema"]["schema"]

    @field_validator("logit_bias")
    @classmethod
    def _bounded_logit_bias(cls, logit_bias: dict[str, float] | None) -> dict[str, float] | None:
        # One validator, not bounds on the values: an error names logit_bias, not logit_bias.<token>.
        if logit_bias is not None and len(logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_TOKENS} tokens may be biased, got {len(logit_bias)}")
        for key, bias in (logit_bias or {}).items():
            if not key.strip().isdecimal():
                raise ValueError(f"keys must be token ids, written as decimal integers (\"198\"), got {key!r}")
            if not (math.isfinite(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise ValueError(f"biases must be between -{MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}, got {bias!r} "
                                 f"for token {key}")
        return logit_bias

    def logit_bias_ids(self) -> dict[int, float]:
        """logit_bias with its keys as token ids (JSON object keys are strings)."""
        return {int(key): bias for key, bias in (self.logit_bias or {}).items()}

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(strings)}; send fewer")
        longest = max((len(s) for s in strings), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise ValueError(
                f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, got one of {longest}; shorten it"
            )
        return stop

    def request_field(self, engine_field: str) -> str:
        """This request's name for a field the engine names (RequestFieldError.field): the same, but
        where an endpoint spells it otherwise (ChatCompletionRequest)."""
        return engine_field

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


