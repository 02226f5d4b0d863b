"""A generation of n choices: one engine request per choice over the one prompt, choice 0 first, and
their outputs merged into one stream of (choice index, output) that aborts them all when closed."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import anyio

from loraloom.engine import EngineClient, RequestOutput, SamplingParams, TenantTag
from loraloom.platform.accounts.keys import Caller
from loraloom.platform.metering.usage import UsageMeter
from loraloom.platform.registry.named import NamedAdapter

ChoiceOutput = tuple[int, RequestOutput]  # (choice index, one of its outputs)


def tenant_tag(caller: Caller) -> TenantTag:
    """Who asks, as the engine sees it: the tenant's id scopes its prefix cache and fair-share account,
    its name labels the engine's metrics, its operator-set weight is its fair share (engine/tenancy.py).
    All of a tenant's keys share one tag: the tenant, not the key, is the unit of isolation."""
    return TenantTag(id=str(caller.tenant_id), name=caller.tenant_name, weight=caller.share_weight)


def choice_request_id(request_id: str, index: int) -> str:
    """The engine's request id of choice `index` (ids are unique in the engine)."""
    return request_id if index == 0 else f"{request_id}-{index}"


async def open_generation(
    engine: EngineClient,
    *,
    request_id: str,
    prompt_token_ids: list[int],
    params: list[SamplingParams],  # one per choice (sampling.choice_params)
    adapter: NamedAdapter | None,
    model: str,
    meter: UsageMeter,
    cache_salt: str | None = None,
) -> AsyncGenerator[ChoiceOutput, None]:
    """Start choice 0 and wait for its first output, so that what the engine refuses (RequestFieldError,
    AdapterLoadError, raised from here) is known before any response (or SSE header) is sent. The other
    choices have the same prompt and parameters but their seed, so the engine would refuse them alike.

    Why choice 0 first and alone: its first output comes once its prompt is computed, and its
    full KV blocks are then in the prefix cache; the other choices, started together after it,
    read them instead of computing the prompt again (with prefix caching on).

    The returned stream yields (choice index, output) and aborts every unfinished choice when it is
    closed or cancelled before the end. `meter` sees every output and is finished when the stream
    ends, however it ends. `cache_salt` (GenerationRequest.engine_cache_salt) isolates the prefix
    cache within the caller's tenant; across tenants it is never shared.
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
