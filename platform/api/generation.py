"""What chat and text completions share: adapter resolution, sampling parameters,
starting an engine stream, collecting it, usage, SSE framing, disconnects."""
from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from loraloom.engine.adapters import AdapterHandle
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.lora import AdapterLoadError
from loraloom.engine.outputs import RequestOutput, TokenLogprob
from loraloom.engine.request import SamplingParams
from loraloom.platform.api.errors import APIError, field_error
from loraloom.platform.api.schemas.generation import DEFAULT_MAX_TOKENS, GenerationRequest, PromptTokensDetails, Usage
from loraloom.platform.metering.usage import UsageMeter
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError
from loraloom.platform.registry.lookup import AdapterLookup

SSE_DONE = "data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads this response

T = TypeVar("T")


def adapter_reference(body: GenerationRequest) -> tuple[str, str]:
    """(name, request field): `adapter_id` names the adapter when set (LoRAX), else `model` does."""
    if body.adapter_id is not None:
        return body.adapter_id, "adapter_id"
    return body.model, "model"


async def resolve_adapter(lookup: AdapterLookup, body: GenerationRequest, tenant_id: uuid.UUID) -> AdapterHandle | None:
    name, param = adapter_reference(body)
    try:
        # A lookup may hash files or query a database: keep it off the event loop.
        return await run_in_threadpool(lookup.resolve, name, tenant_id)
    except AdapterNotFoundError as error:
        raise APIError(404, str(error), param=param, code="model_not_found") from None
    except InvalidAdapterError as error:
        raise APIError(400, str(error), param=param) from None


def default_max_tokens(num_prompt_tokens: int, max_model_len: int) -> int:
    """The context left after the prompt, capped. At least 1, so a prompt that
    fills the context is reported as too long rather than as a bad max_tokens."""
    return max(1, min(DEFAULT_MAX_TOKENS, max_model_len - num_prompt_tokens))


def sampling_params(body: GenerationRequest, *, max_tokens: int, logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=body.stop_list(),
        stop_token_ids=list(body.stop_token_ids),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
    )


async def open_generation(
    engine: AsyncEngine,
    *,
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    adapter: AdapterHandle | None,
    field_names: dict[str, str],
    adapter_param: str,
    model: str,
    meter: UsageMeter,
) -> AsyncGenerator[RequestOutput, None]:
    """Start a request and wait for its first output, so that what the engine
    refuses becomes a 400 before any response (or SSE header) is sent.

    `field_names` maps the engine's field names in its error messages to this
    endpoint's request fields. The returned stream aborts the request when it
    is closed or cancelled before the end. `meter` sees every output and is
    finished when the stream ends, however it ends.
    """
    meter.begin(request_id=request_id, model=model, adapter=adapter)
    outputs = engine.generate(request_id=request_id, prompt_token_ids=prompt_token_ids, params=params, adapter=adapter)
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
    return _stream_from(first, outputs, meter)


async def _stream_from(
    first: RequestOutput, rest: AsyncGenerator[RequestOutput, None], meter: UsageMeter
) -> AsyncGenerator[RequestOutput, None]:
    failed = False
    try:
        yield first
        if not first.finished:
            async for output in rest:
                meter.observe(output)
                yield output
    except Exception:
        failed = True
        raise
    finally:
        # Shielded: on a client disconnect this runs inside a cancelled scope,
        # and the abort must still reach the engine.
        with anyio.CancelScope(shield=True):
            await rest.aclose()
        meter.finish(failed=failed)


@dataclass
class Collected:
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    last: RequestOutput


async def collect(outputs: AsyncIterator[RequestOutput]) -> Collected:
    texts: list[str] = []
    logprobs: list[TokenLogprob] | None = None
    last: RequestOutput | None = None
    async for output in outputs:
        texts.append(output.text_delta)
        if output.logprobs is not None:
            logprobs = [] if logprobs is None else logprobs
            logprobs.extend(output.logprobs)
        last = output
    assert last is not None, "open_generation yields at least one output"
    return Collected(text="".join(texts), logprobs=logprobs, finish_reason=last.finish_reason, last=last)


def usage(output: RequestOutput) -> Usage:
    return Usage(
        prompt_tokens=output.num_prompt_tokens,
        completion_tokens=output.num_output_tokens,
        total_tokens=output.num_prompt_tokens + output.num_output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=output.num_cached_tokens),
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


async def respond(
    request: Request,
    engine: AsyncEngine,
    body: GenerationRequest,
    *,
    id_prefix: str,
    prompt_token_ids: list[int],
    max_tokens: int | None,
    logprobs: int | None,
    adapter: AdapterHandle | None,
    field_names: dict[str, str],
    meter: UsageMeter,
    events: Callable[[AsyncGenerator[RequestOutput, None], ResponseHead, bool], AsyncGenerator[str, None]],
    build: Callable[[Collected, ResponseHead], T],
) -> T | Response:
    """Start the generation (open_generation; `max_tokens` None: the default),
    then answer with server-sent events made by `events` (given whether the
    client asked for usage), or with the whole response made by `build` once
    generation ends. A client that leaves before its answer begins streaming
    cancels the generation (Starlette handles it after)."""
    if max_tokens is None:
        max_tokens = default_max_tokens(len(prompt_token_ids), engine.max_model_len)
    head = ResponseHead(id=f"{id_prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=body.model)
    start = functools.partial(
        open_generation,
        engine,
        request_id=head.id,
        prompt_token_ids=prompt_token_ids,
        params=sampling_params(body, max_tokens=max_tokens, logprobs=logprobs),
        adapter=adapter,
        field_names=field_names,
        adapter_param=adapter_reference(body)[1],
        model=body.model,
        meter=meter,
    )
    outputs = await cancel_on_disconnect(request, start)
    if outputs is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if body.stream:
        return StreamingResponse(events(outputs, head, body.include_usage), media_type="text/event-stream")
    collected = await cancel_on_disconnect(request, lambda: collect(outputs))
    if collected is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return build(collected, head)


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
