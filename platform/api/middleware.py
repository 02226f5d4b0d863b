"""The app's two ASGI middlewares, both pure ASGI (not BaseHTTPMiddleware, which would break
streaming and disconnect detection).

BodySizeLimit refuses request bodies over a size cap with 413, before the JSON parser sees
them. Adapter uploads are the exception: they may be far larger than any JSON body, so they
stream through to the multipart parser (which spools to disk) under their own, larger cap
instead of being buffered here.

AuditMiddleware hands every mutating call to the audit log (metering/audit.py).
"""
from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraloom.platform.api.errors import APIError, error_response
from loraloom.platform.metering.audit import audit_entry, is_audited
from loraloom.platform.settings import DEFAULT_MAX_REQUEST_BODY_BYTES as DEFAULT_MAX_BODY_BYTES

# POST /v1/adapters/{name}/versions and POST /v1/files: multipart adapter files and datasets.
UPLOAD_PATH = re.compile(r"^/v1/(adapters/[^/]+/versions|files)/?$")
# A created resource's id is read from the JSON response; larger bodies are not kept for that.
MAX_INSPECTED_BODY_BYTES = 64 * 1024


class BodySizeLimit:
    """The body is read here, up to the cap, and handed to the app as one
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


class AuditMiddleware:
    """Submits to `app.state.audit_writer` of the FastAPI app serving the call."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_audited(scope):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})  # the dict request.state writes the caller into
        status_code = 500  # if the app fails before answering, the client gets a 500
        is_json = False
        body = bytearray()

        async def send_and_watch(message: Message) -> None:
            nonlocal status_code, is_json
            if message["type"] == "http.response.start":
                status_code = message["status"]
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                is_json = content_type.startswith(b"application/json")
            elif message["type"] == "http.response.body" and is_json and len(body) <= MAX_INSPECTED_BODY_BYTES:
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            entry = audit_entry(scope, status_code, _parse_json(body) if is_json else None)
            if entry is not None:
                scope["app"].state.audit_writer.submit(entry)


def _parse_json(body: bytearray) -> Any:
    if len(body) > MAX_INSPECTED_BODY_BYTES:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
