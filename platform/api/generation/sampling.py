"""The engine's sampling parameters of a request: what it sets, else the served model's generation
defaults, else the server's; its grammar compiled; one set per choice."""
from __future__ import annotations

import dataclasses
from typing import TypeVar

from loraloom.engine import CompiledGrammar, EngineClient, GenerationDefaults, SamplingParams
from loraloom.platform.api.schemas.generation import DEFAULT_MAX_TOKENS, GenerationRequest

T = TypeVar("T")


def default_max_tokens(num_prompt_tokens: int, max_model_len: int, defaults: GenerationDefaults) -> int:
    """The context left after the prompt, capped by the model's max_new_tokens, else by ours. At least 1,
    so a prompt that fills the context is reported as too long rather than as a bad max_tokens."""
    cap = DEFAULT_MAX_TOKENS if defaults.max_tokens is None else defaults.max_tokens
    return max(1, min(cap, max_model_len - num_prompt_tokens))


def _chosen(value: T | None, model_default: T | None, fallback: T) -> T:
    """The request's value, else the model's, else the server's."""
    if value is not None:
        return value
    return fallback if model_default is None else model_default


async def compile_grammar(
    engine: EngineClient, body: GenerationRequest, tool_grammar: str | None = None
) -> CompiledGrammar | None:
    """The grammar a JSON response_format asks for (None for text), or the Lark grammar of constrained
    tool calls, compiled by the engine off its step thread, before the request is queued. A schema it
    cannot serve raises RequestFieldError naming response_format (or tools): a 400 (api/errors.py)."""
    if tool_grammar is None and not body.wants_json:
        return None
    return await engine.compile_grammar(tool_grammar if tool_grammar is not None else body.json_schema())


def sampling_params(
    body: GenerationRequest,
    *,
    max_tokens: int,
    logprobs: int | None,
    defaults: GenerationDefaults,
    grammar: CompiledGrammar | None = None,
) -> SamplingParams:
    """The engine's parameters: what the request sets, else the model's `defaults`, else 1 (0 for top_k)."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_chosen(body.temperature, defaults.temperature, 1.0),
        top_p=_chosen(body.top_p, defaults.top_p, 1.0),
        top_k=_chosen(body.top_k, defaults.top_k, 0),
        seed=body.seed,
        stop=body.stop_list(),
        stop_token_ids=list(body.stop_token_ids),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=_chosen(body.repetition_penalty, defaults.repetition_penalty, 1.0),
        logit_bias=body.logit_bias_ids(),
        min_tokens=body.min_tokens,
        grammar=grammar,
    )


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice. With a seed, choice i draws with seed + i: the choices differ,
    and each is reproducible (the same as an n=1 request with that seed)."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=params.seed + index) for index in range(n)]
