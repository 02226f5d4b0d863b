"""Refuse request bodies over a size cap with 413, before the JSON parser sees them.

Adapter uploads are the exception: they may be far larger than any JSON body,
so they stream through to the multipart parser (which spools to disk) under
their own, larger cap instead of being buffered here.
"""
from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraloom.platform.api.errors import APIError, error_response
from loraloom.platform.settings import DEFAULT_MAX_REQUEST_BODY_BYTES as DEFAULT_MAX_BODY_BYTES

# POST /v1/adapters/{name}/versions and POST /v1/files: multipart adapter files and datasets.
UPLOAD_PATH = re.compile(r"^/v1/(adapters/[^/]+/versions|files)/?$")


class BodySizeLimit:
    """Pure ASGI middleware (not BaseHTTPMiddleware, which would break streaming and disconnect detection).

    The body is read here, up to the cap, and handed to the app as one
    message; later receive() calls go to the server, so the app still sees
    the client's disconnect.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_upload_bytes: int | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes if max_upload_bytes is not None else max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST" and UPLOAD_PATH.match(scope["path"]):
            await self._stream_upload(scope, receive, send)
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

    async def _stream_upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the body through unbuffered, refusing a declared size over the upload cap up front
        and cutting off (as a disconnect) a body that grows past it anyway."""
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_upload_bytes:
            too_large = APIError(
                413, f"The upload exceeds the limit of {self.max_upload_bytes} bytes", code="request_too_large"
            )
            await error_response(too_large)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_upload_bytes:
                return {"type": "http.disconnect"}
            return message

        await self.app(scope, counting_receive, send)
