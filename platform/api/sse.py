"""Server-sent events as proxies and clients need them: headers that stop caching and buffering,
and a comment line while nothing else is sent, so an idle-timeout proxy (nginx, a load balancer)
does not cut a stream whose first token waits on a long prefill or a full queue.

Clients skip comment lines (the SSE specification; the openai package does).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi.responses import StreamingResponse

from loraloom.platform.api.errors import APIError, api_error_for
from loraloom.platform.api.inbox import Inbox
from loraloom.platform.api.schemas.common import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

KEEP_ALIVE = ": keep-alive\n\n"
# no-cache: never served from a cache; X-Accel-Buffering: nginx passes each event on as it comes.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

T = TypeVar("T")


def sse_response(events: AsyncIterator[str], keepalive_s: float) -> StreamingResponse:
    return StreamingResponse(with_keepalive(events, keepalive_s), media_type="text/event-stream", headers=SSE_HEADERS)


async def with_keepalive(events: AsyncIterator[str], interval_s: float) -> AsyncIterator[str]:
    """`events`, with KEEP_ALIVE sent after every `interval_s` that passes without one."""
    inbox = Inbox(events)  # one task per stream, none per event (api/inbox.py)
    try:
        while True:
            try:
                async with asyncio.timeout(interval_s) as waited:
                    event = await inbox.next()
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not waited.expired():  # the stream's own error, not the interval passing
                    raise
                yield KEEP_ALIVE
                continue
            yield event
    finally:  # the end, or the client left while an event was awaited
        await inbox.close()


def error_event(error: APIError) -> str:
    """OpenAI's error in a stream already under way: one `data:` event with the error body."""
    body = ErrorResponse(error=ErrorDetail(message=error.message, type=error.error_type, param=error.param,
                                           code=error.code))
    return f"data: {body.model_dump_json()}\n\n"


async def ending_in_error_event(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The events; if generation fails once the 200 is sent (an engine error of this request, a
    bug), a last error event instead of a stream cut short. Internals never reach the client:
    an error with no DOMAIN_ERRORS answer is a bare 500."""
    try:
        async for event in events:
            yield event
    except APIError as error:  # a deliberate answer (a key revoked mid-stream), not a failure to log
        yield error_event(error)
    except Exception as error:
        logger.exception("stream failed after its first event")
        yield error_event(api_error_for(error))


async def opened_within(opening: Awaitable[T], timeout_s: float) -> asyncio.Future[T]:
    """Start `opening` and wait at most `timeout_s` for it: the future, done or still running."""
    future = asyncio.ensure_future(opening)
    await asyncio.wait({future}, timeout=timeout_s)
    return future


async def events_once_open(opening: asyncio.Future[T | None], events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The events of a stream whose response began before the generation was accepted: `events`,
    read once `opening` is done (they read what it opened); a refusal goes out as an error event
    instead, since the status line has already been sent."""
    try:
        opened = await opening
    except APIError as error:
        yield error_event(error)
        return
    if opened is None:  # the client left
        return
    async for event in events:
        yield event
