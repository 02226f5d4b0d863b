"""The browser-facing security headers of every response, console and API alike: a strict
Content-Security-Policy, no framing, no MIME sniffing, no referrer.

The console (web/dist) is built by Vite into external scripts only, so its policy allows scripts
from this origin and nothing inline: an injected `<script>` or `onclick=` does not run. Styles may be
inline (`style-src 'unsafe-inline'`): React and uPlot set `style=` attributes, which cannot run code.

/docs and /redoc (offline_docs.py) are the exception: Swagger UI's page starts itself with an inline
script, and so does its OAuth2 redirect page. Those pages get a policy allowing exactly their inline
scripts, by hash, computed from the page as it is sent, so nothing else inline runs there either;
ReDoc renders in a worker made from a blob: URL.
"""
from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import Message, Receive, Scope, Send

from loraloom.platform.api.asgi import HttpMiddleware

_COMMON = (
    "default-src 'self'",
    "img-src 'self' data:",  # the console's empty favicon, Swagger UI's icons
    "style-src 'self' 'unsafe-inline'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)
CONTENT_SECURITY_POLICY = "; ".join(("script-src 'self'", *_COMMON))
# The pages of the API's documentation, which run inline scripts of their own (allowed by hash).
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
# At most this much of a documentation page is held to hash its scripts (they are a few KiB).
MAX_DOCS_PAGE_BYTES = 1024 * 1024
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)

SECURITY_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def docs_policy(page: bytes) -> str:
    """The policy of a documentation page: its own inline scripts, by their sha256, and nothing else inline."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"
        for script in _INLINE_SCRIPT.findall(page)
    ]
    return "; ".join((" ".join(["script-src 'self'", *hashes]), "worker-src 'self' blob:", *_COMMON))


def _with_headers(message: Message, policy: str) -> Message:
    present = {name.lower() for name, _ in message.get("headers", [])}
    added = [(name, value) for name, value in (*SECURITY_HEADERS, (b"content-security-policy", policy.encode()))
             if name not in present]
    return {**message, "headers": [*message.get("headers", []), *added]}


class SecurityHeaders(HttpMiddleware):
    """Adds the headers to every HTTP response (a header the app set itself is kept)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in DOCS_PATHS:
            await self._documentation_page(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = _with_headers(message, CONTENT_SECURITY_POLICY)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _documentation_page(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Holds the page back until its body is complete, to hash the scripts the policy allows."""
        start: Message | None = None
        body = bytearray()

        async def send_hashed(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False) and len(body) <= MAX_DOCS_PAGE_BYTES:
                return
            policy = docs_policy(bytes(body)) if len(body) <= MAX_DOCS_PAGE_BYTES else CONTENT_SECURITY_POLICY
            await send(_with_headers(start, policy))
            start = None
            await send({**message, "body": bytes(body)})
            body.clear()

        await self.app(scope, receive, send_hashed)
