"""What the app's pure-ASGI middlewares share. Pure ASGI rather than BaseHTTPMiddleware, which
would buffer streams and hide the client's disconnect."""
from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """Acts on HTTP requests in `handle`; anything else (lifespan, websockets) goes straight to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError
