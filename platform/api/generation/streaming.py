"""Answering a generation as server-sent events, and noticing a client that leaves before its answer."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import Request, Response
from pydantic import BaseModel

from loraloom.platform.api.sse import events_once_open, sse_response

SSE_DONE = "data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads this response

T = TypeVar("T")


def sse_event(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


def _json_data(schema_name: str) -> dict[str, Any]:
    return {"type": "string", "contentMediaType": "application/json",
            "contentSchema": {"$ref": f"#/components/schemas/{schema_name}"}}


def sse_response_doc(chunk: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI entry of a 200 that is JSON, or server-sent events with `stream: true`.

    An event stream is documented by the schema of one event as a client parses it (its `data`,
    `event`, `id` fields): here each `data` is a chunk's JSON, an error's JSON (a failure once the
    200 is sent, sse.error_event) or the closing `[DONE]`. The chunk's schema is a component
    (openapi.STREAMED_CHUNKS puts it there when no route answers it as JSON)."""
    data = {"anyOf": [_json_data(chunk.__name__), _json_data("ErrorResponse"), {"const": "[DONE]"}]}
    event = {"type": "object", "required": ["data"], "properties": {"data": data},
             "description": f"With stream=true: `data: <{chunk.__name__} JSON>` events, then `data: [DONE]`."}
    return {"content": {"text/event-stream": {"schema": event}}}


def stream_response(opened: asyncio.Future[Any | None], events: AsyncIterator[str], keepalive_s: float) -> Response:
    """The answer to a generation being opened (`opened`: done within one keep-alive interval, or not yet;
    None once done if the client left). A refusal in that interval is a plain 400 (raised here). A slower
    first output (a long prefill, a busy engine) starts the stream at once, kept alive until it comes;
    `events` are read once the generation opened, and a refusal then arrives as an error event."""
    if not opened.done():
        return sse_response(events_once_open(opened, events), keepalive_s)
    if opened.result() is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return sse_response(events, keepalive_s)


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
