"""What chat and text completions share: adapter resolution, sampling parameters,
starting an engine stream per choice, collecting them, usage, SSE framing, disconnects."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from loraloom.engine import (
    AdapterLoadError,
    CompiledGrammar,
    EngineClient,
    GenerationDefaults,
    RequestOutput,
    SamplingParams,
    TenantTag,
    TokenLogprob,
)
from loraloom.platform.accounts.keys import Caller
from loraloom.platform.api.errors import APIError, field_error
from loraloom.platform.api.revocation import revocable
from loraloom.platform.api.schemas.generation import DEFAULT_MAX_TOKENS, GenerationRequest, PromptTokensDetails, Usage
from loraloom.platform.api.schemas.ignored_fields import IGNORED_FIELDS_HEADER, ignored_field_names
from loraloom.platform.api.sse import ending_in_error_event, events_once_open, opened_within, sse_response
from loraloom.platform.metering.usage import UsageMeter
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError
from loraloom.platform.registry.lookup import AdapterLookup
from loraloom.platform.registry.named import NamedAdapter

logger = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads this response

T = TypeVar("T")
ChoiceOutput = tuple[int, RequestOutput]  # (choice index, one of its outputs)


def adapter_reference(body: GenerationRequest) -> tuple[str, str]:
    """(name, request field): `adapter_id` names the adapter when set (LoRAX), else `model` does."""
    if body.adapter_id is not None:
        return body.adapter_id, "adapter_id"
    return body.model, "model"


async def resolve_adapter(
    lookup: AdapterLookup, body: GenerationRequest, tenant_id: uuid.UUID, meter: UsageMeter
) -> NamedAdapter | None:
    name, param = adapter_reference(body)
    meter.adapter_reference = name  # before resolving: a reference that fails to resolve is logged too
    adapter = await _resolve(lookup, name, param, tenant_id)
    if param == "adapter_id":
        check_model_agrees(body, adapter, await _resolve(lookup, body.model, "model", tenant_id))
    return adapter


async def _resolve(lookup: AdapterLookup, name: str, param: str, tenant_id: uuid.UUID) -> NamedAdapter | None:
    try:
        # A lookup may hash files or query a database: keep it off the event loop.
        return await run_in_threadpool(lookup.resolve_named, name, tenant_id)
    except AdapterNotFoundError as error:
        raise APIError(404, str(error), param=param, code="model_not_found") from None
    except InvalidAdapterError as error:
        raise APIError(400, str(error), param=param) from None


def check_model_agrees(body: GenerationRequest, adapter: NamedAdapter | None, model: NamedAdapter | None) -> None:
    """With `adapter_id` set, `model` may name the base or the same adapter: the response's `model`
    echoes the request's, so a different adapter there would say that something ran which did not.
    Same adapter means the same version of the same name: two names for equal bytes are still two."""
    if model is not None and (adapter is None or model.handle != adapter.handle):
        raise APIError(
            400,
            f"model {body.model!r} and adapter_id {body.adapter_id!r} name different adapters; set model to the "
            "base model (or to the same adapter) when adapter_id names the adapter, or leave adapter_id out",
            param="adapter_id",
        )


def name_ignored_fields(result: T | Response, response: Response, body: GenerationRequest) -> T | Response:
    """Name the accepted-and-ignored fields the client sent in a header of the answer: on `result` when it
    is a response already (a stream), else on the route's `response` (FastAPI merges its headers)."""
    names = ignored_field_names(body)
    if names:
        logger.debug("request fields ignored: %s", ", ".join(names))
        (result if isinstance(result, Response) else response).headers[IGNORED_FIELDS_HEADER] = ", ".join(names)
    return result


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
    tool calls, compiled by the engine off its step thread, before the request is queued; a schema it
    cannot serve is a 400 naming response_format (or tools)."""
    if tool_grammar is None and not body.wants_json:
        return None
    try:
        return await engine.compile_grammar(tool_grammar if tool_grammar is not None else body.json_schema())
    except ValueError as error:
        raise field_error(error, {}) from None


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


def tenant_tag(caller: Caller) -> TenantTag:
    """Who asks, as the engine sees it: the tenant's id scopes its prefix cache and fair-share account,
    its name labels the engine's metrics, its operator-set weight is its fair share (engine/tenancy.py).
    All of a tenant's keys share one tag: the tenant, not the key, is the unit of isolation."""
    return TenantTag(id=str(caller.tenant_id), name=caller.tenant_name, weight=caller.share_weight)


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice. With a seed, choice i draws with seed + i: the choices differ,
    and each is reproducible (the same as an n=1 request with that seed)."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=params.seed + index) for index in range(n)]


def choice_request_id(request_id: str, index: int) -> str:
    """The engine's request id of choice `index` (ids are unique in the engine)."""
    return request_id if index == 0 else f"{request_id}-{index}"


async def open_generation(
    engine: EngineClient,
    *,
    request_id: str,
    prompt_token_ids: list[int],
    params: list[SamplingParams],  # one per choice (choice_params)
    adapter: NamedAdapter | None,
    field_names: dict[str, str],
    adapter_param: str,
    model: str,
    meter: UsageMeter,
    cache_salt: str | None = None,
) -> AsyncGenerator[ChoiceOutput, None]:
    """Start choice 0 and wait for its first output, so that what the engine refuses becomes a 400
    before any response (or SSE header) is sent. The other choices have the same prompt and
    parameters but their seed, so the engine would refuse them alike.

    Why choice 0 first and alone: its first output comes once its prompt is computed, and its
    full KV blocks are then in the prefix cache; the other choices, started together after it,
    read them instead of computing the prompt again (with prefix caching on).

    `field_names` maps the engine's field names in its error messages to this endpoint's request
    fields. The returned stream yields (choice index, output) and aborts every unfinished choice
    when it is closed or cancelled before the end. `meter` sees every output and is finished
    when the stream ends, however it ends. `cache_salt` (GenerationRequest.engine_cache_salt) isolates the
    prefix cache within the caller's tenant; across tenants it is never shared.
    """
    meter.begin(request_id=request_id, model=model, adapter=adapter, num_choices=len(params))

    tenant = tenant_tag(meter.caller)

    def start(index: int) -> AsyncGenerator[RequestOutput, None]:
        return engine.generate(request_id=choice_request_id(request_id, index), prompt_token_ids=prompt_token_ids,
                               params=params[index], adapter=None if adapter is None else adapter.handle,
                               tenant=tenant, cache_salt=cache_salt)

    outputs = start(0)
    try:
        first = await anext(outputs)
    except AdapterLoadError as error:
        meter.finish(failed=True)
        raise APIError(400, str(error), param=adapter_param) from None
    except ValueError as error:
        meter.finish(failed=True)
        raise field_error(error, field_names) from None
    except BaseException as error:
        meter.finish(failed=isinstance(error, Exception))  # a cancellation is the client leaving
        raise
    meter.observe(first)
    others = [start(index) for index in range(1, len(params))]
    if not others:
        return _stream_from(first, outputs, meter)
    return _merged_choices(first, [outputs, *others], meter)


async def _stream_from(
    first: RequestOutput, rest: AsyncGenerator[RequestOutput, None], meter: UsageMeter
) -> AsyncGenerator[ChoiceOutput, None]:
    """One choice: its outputs in order."""
    failed = False
    try:
        yield 0, first
        if not first.finished:
            async for output in rest:
                meter.observe(output)
                yield 0, output
    except Exception:
        failed = True
        raise
    finally:
        # Shielded: on a client disconnect this runs inside a cancelled scope,
        # and the abort must still reach the engine.
        with anyio.CancelScope(shield=True):
            await rest.aclose()
        meter.finish(failed=failed)


async def _merged_choices(
    first: RequestOutput, streams: list[AsyncGenerator[RequestOutput, None]], meter: UsageMeter
) -> AsyncGenerator[ChoiceOutput, None]:
    """Several choices: choice 0's first output, then every choice's outputs as they come. One task per
    choice reads its stream into a shared queue; the other choices' streams start (and their requests
    reach the engine, together) when the first output has been taken."""
    queue: asyncio.Queue[ChoiceOutput | Exception] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as error:  # handed to the reader, which raises it
            queue.put_nowait(error)

    failed = False
    tasks: list[asyncio.Task[None]] = []
    try:
        yield 0, first
        unfinished = len(streams) - first.finished
        tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)
                 if index > 0 or not first.finished]
        while unfinished:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            meter.observe(item[1])
            unfinished -= item[1].finished
            yield item
    except Exception:
        failed = True
        raise
    finally:
        with anyio.CancelScope(shield=True):  # as in _stream_from: the aborts must reach the engine
            for task in tasks:
                task.cancel()  # a stream cancelled mid-way aborts its request
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in streams:
                await stream.aclose()
        meter.finish(failed=failed)


@dataclass
class Collected:
    """One choice's whole generation."""

    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    last: RequestOutput


async def collect(outputs: AsyncIterator[ChoiceOutput], num_choices: int) -> list[Collected]:
    texts: list[list[str]] = [[] for _ in range(num_choices)]
    logprobs: list[list[TokenLogprob] | None] = [None] * num_choices
    lasts: list[RequestOutput | None] = [None] * num_choices
    async for index, output in outputs:
        texts[index].append(output.text_delta)
        if output.logprobs is not None:
            logprobs[index] = (logprobs[index] or []) + output.logprobs
        lasts[index] = output
    assert all(last is not None for last in lasts), "every choice yields at least one output"
    return [Collected(text="".join(texts[index]), logprobs=logprobs[index], finish_reason=last.finish_reason,
                      last=last) for index, last in enumerate(lasts)]


def usage(lasts: list[RequestOutput]) -> Usage:
    """From each choice's last output: the prompt counted once (the choices share it), completions summed."""
    prompt = lasts[0]
    completion_tokens = sum(last.num_output_tokens for last in lasts)
    return Usage(
        prompt_tokens=prompt.num_prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt.num_prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=prompt.num_cached_tokens),
    )


def token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def sse_response_doc(chunk_schema: str) -> dict[str, Any]:
    """The OpenAPI entry of a 200 that is JSON, or server-sent events with `stream: true`."""
    events = f"With stream=true: `data: <{chunk_schema} JSON>` events, then `data: [DONE]`."
    return {"content": {"text/event-stream": {"schema": {"type": "string", "description": events}}}}


def sse_event(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"



@dataclass(frozen=True)
class ResponseHead:
    """What the response and each of its chunks carry: OpenAI's id, created (Unix seconds) and model."""

    id: str
    created: int
    model: str
    num_choices: int = 1


async def respond(
    request: Request,
    engine: EngineClient,
    body: GenerationRequest,
    *,
    id_prefix: str,
    prompt_token_ids: list[int],
    max_tokens: int | None,
    logprobs: int | None,
    adapter: NamedAdapter | None,
    field_names: dict[str, str],
    meter: UsageMeter,
    events: Callable[[AsyncGenerator[ChoiceOutput, None], ResponseHead, bool], AsyncGenerator[str, None]],
    build: Callable[[list[Collected], ResponseHead], T],
    tool_grammar: str | None = None,
) -> T | Response:
    """Start the generation (open_generation; `max_tokens` None: the default),
    then answer with server-sent events made by `events` (given whether the
    client asked for usage), or with the whole response made by `build` once
    generation ends. A client that leaves before its answer begins streaming
    cancels the generation (Starlette handles it after). `tool_grammar`: constrained tool calls' grammar."""
    if max_tokens is None:
        max_tokens = default_max_tokens(len(prompt_token_ids), engine.max_model_len, engine.generation_defaults)
    # Charged at most its prompt and every token it may generate; trued up when its meter finishes.
    rate_limits = request.app.state.rate_limits
    ticket = await rate_limits.admit(request, engine, meter, tokens=len(prompt_token_ids) + max_tokens * body.n)
    try:
        grammar = await compile_grammar(engine, body, tool_grammar)
    except BaseException:
        rate_limits.release(ticket)  # refused before it reached the engine
        raise
    head = ResponseHead(id=f"{id_prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=body.model,
                        num_choices=body.n)
    start = functools.partial(
        open_generation,
        engine,
        request_id=head.id,
        prompt_token_ids=prompt_token_ids,
        params=choice_params(sampling_params(body, max_tokens=max_tokens, logprobs=logprobs,
                                             defaults=engine.generation_defaults, grammar=grammar), body.n),
        adapter=adapter,
        field_names=field_names,
        adapter_param=adapter_reference(body)[1],
        model=body.model,
        meter=meter,
        cache_salt=body.engine_cache_salt(),
    )
    # Revoking the key (or its expiry) ends the generation, from its queueing to its last token.
    revocation = request.app.state.key_watch.watch(meter.caller.api_key_id)
    if body.stream:
        return await stream_response(
            request, cancel_on_disconnect(request, lambda: revocation.guard(start())),
            lambda outputs: ending_in_error_event(events(revocable(outputs, revocation), head, body.include_usage)),
        )
    outputs = await cancel_on_disconnect(request, lambda: revocation.guard(start()))
    if outputs is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    collected = await cancel_on_disconnect(request, lambda: collect(revocable(outputs, revocation), body.n))
    if collected is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return build(collected, head)


async def stream_response(
    request: Request,
    opening: Awaitable[AsyncGenerator[ChoiceOutput, None] | None],
    events: Callable[[AsyncGenerator[ChoiceOutput, None]], AsyncIterator[str]],
) -> Response:
    """Wait up to one keep-alive interval for the generation to be accepted: a refusal in that time
    is a plain 400. A slower first output (a long prefill, a busy engine) starts the stream at once,
    kept alive until it comes; a refusal then arrives as an error event."""
    keepalive_s = request.app.state.settings.sse_keepalive_interval_s
    opened = await opened_within(opening, keepalive_s)
    if not opened.done():
        return sse_response(events_once_open(opened, events), keepalive_s)
    outputs = opened.result()
    if outputs is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return sse_response(events(outputs), keepalive_s)


async def cancel_on_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run `work`; cancel it if the client disconnects first, and return None then.

    Streaming responses get this from Starlette; a plain response would
    otherwise keep generating (and holding KV blocks) for a client that left.
    """
    results: list[T] = []
    failures: list[Exception] = []

    async def cancel_when_client_leaves(scope: anyio.CancelScope) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(cancel_when_client_leaves, group.cancel_scope)
        try:
            results.append(await work())
        except Exception as error:  # re-raised below the task group, so it is not wrapped in an ExceptionGroup
            failures.append(error)
        group.cancel_scope.cancel()
    if failures:
        raise failures[0]
    return results[0] if results else None
