"""405 Method Not Allowed with an `Allow` header naming every method the path takes (RFC 9110).

Starlette answers a known path with an unknown method from the first route whose path matched, so its
`Allow` named that route's methods only: `GET` for /v1/adapters/{name}, whose DELETE is another route.
The handler here asks every route of the app instead."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.routing import iter_route_contexts
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import Scope

from loraloom.platform.api.errors import APIError, error_response


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route whose path matches the request's, whatever its method."""
    methods: set[str] = set()
    # Route contexts, not app.routes: the routes of included routers are inside them.
    for route in iter_route_contexts(app.routes):
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] is not Match.NONE:
            methods |= route_methods
    return sorted(methods)


async def _method_not_allowed(request: Request, error: HTTPException) -> JSONResponse:
    allow = ", ".join(allowed_methods(request.app, request.scope))
    return error_response(APIError(405, f"{request.method} is not allowed here; this path takes {allow}"),
                          headers={**(error.headers or {}), "Allow": allow})


def install_allow_header(app: FastAPI) -> None:
    # Keyed by status, it takes precedence over errors.py's handler of every HTTPException.
    app.add_exception_handler(405, _method_not_allowed)
