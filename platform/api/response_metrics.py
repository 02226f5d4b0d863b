"""Counts every response by route template and status, and every OpenAI-shaped error by type and
code (metering/http_metrics.py), as the responses go out.

An error is read from the body the client gets: a JSON error response (small: only those are
kept, up to MAX_ERROR_BODY_BYTES), or an SSE event `data: {"error": ...}` of a stream that failed
after its 200. So every path that answers an error is counted, the middlewares' refusals (413,
429) included, with no call to make at each of them.

Pure ASGI (api/asgi.py), so streams pass through unbuffered: of a stream, only events that begin
as an error event are parsed.
"""
from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraloom.platform.api.asgi import HttpMiddleware
from loraloom.platform.metering.http_metrics import UNMATCHED_ROUTE, HttpResponseCounts

MAX_ERROR_BODY_BYTES = 64 * 1024
STREAM_ERROR_PREFIX = b'data: {"error"'


def route_template(scope: Scope) -> str:
    """The path template of the route that served the request (Starlette's router puts the route in
    the scope), e.g. `/v1/fine_tuning/jobs/{job_id}`; UNMATCHED_ROUTE when none did."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED_ROUTE


class ResponseMetrics(HttpMiddleware):
    def __init__(self, app: ASGIApp, counts: HttpResponseCounts) -> None:
        super().__init__(app)
        self.counts = counts

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500  # if the app fails before answering, the client gets a 500
        kind = "other"  # "error": a JSON error body to read; "stream": events to watch
        body = bytearray()

        async def send_and_count(message: Message) -> None:
            nonlocal status, kind
            if message["type"] == "http.response.start":
                status = message["status"]
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if status >= 400 and content_type.startswith(b"application/json"):
                    kind = "error"
                elif content_type.startswith(b"text/event-stream"):
                    kind = "stream"
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if kind == "error" and len(body) <= MAX_ERROR_BODY_BYTES:
                    body.extend(chunk)
                elif kind == "stream" and chunk.startswith(STREAM_ERROR_PREFIX):
                    self._count_error(chunk[len(b"data: "):])
            await send(message)

        try:
            await self.app(scope, receive, send_and_count)
        finally:
            self.counts.count_response(method=scope["method"], route=route_template(scope), status=status)
            if kind == "error":
                self._count_error(bytes(body))

    def _count_error(self, payload: bytes) -> None:
        try:
            error = json.loads(payload)["error"]
            error_type, code = str(error["type"]), error.get("code")
        except (ValueError, KeyError, TypeError):
            return  # not an OpenAI error body (cut short, or another JSON): nothing to count
        self.counts.count_error(error_type=error_type, code=None if code is None else str(code))
