"""Refuse request bodies over a size cap with 413, before the JSON parser sees them."""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraloom.platform.api.errors import APIError, error_response

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class BodySizeLimit:
    """Pure ASGI middleware (not BaseHTTPMiddleware, which would break streaming and disconnect detection).

    The body is read here, up to the cap, and handed to the app as one
    message; later receive() calls go to the server, so the app still sees
    the client's disconnect.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more_body = True
        while more_body:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before the body was complete: nothing to answer
            chunk = message.get("body", b"")
            more_body = message.get("more_body", False)
            size += len(chunk)
            # Past the cap, keep reading but drop the bytes: a client still
            # writing its body would otherwise see a reset instead of the 413.
            if size <= self.max_body_bytes:
                chunks.append(chunk)
        if size > self.max_body_bytes:
            too_large = APIError(
                413, f"The request body exceeds the limit of {self.max_body_bytes} bytes", code="request_too_large"
            )
            await error_response(too_large)(scope, receive, send)
            return
        body_delivered = False

        async def replay_body_then_receive() -> Message:
            nonlocal body_delivered
            if body_delivered:
                return await receive()
            body_delivered = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay_body_then_receive, send)
