"""/docs (Swagger UI) and /redoc, with their scripts and styles served from the fastapi-offline package's
files instead of a CDN, so that they load on a machine with no internet.

The pages are module-level functions that find their app on the request. fastapi-offline's own pages
are closures over the app they were made for; a closure given to a router stays in FastAPI's
process-wide cache of route callables (fastapi.dependencies.models, 4096 entries) after the app is gone,
and keeps the app alive, and with it the engine in its state: a test session that built an app per
module grew by about 2 GB a module and never gave it back.
"""
from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/static-offline-docs"
STATIC_DIR = Path(fastapi_offline.__file__).parent / "static"


def _static(request: Request, name: str) -> str:
    return f"{request.scope.get('root_path', '')}{STATIC_URL}/{name}"


async def swagger_ui(request: Request) -> HTMLResponse:
    app: FastAPI = request.app
    return get_swagger_ui_html(
        openapi_url=f"{request.scope.get('root_path', '')}{app.openapi_url}",
        title=f"{app.title} - Swagger UI",
        oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
        swagger_js_url=_static(request, "swagger-ui-bundle.js"),
        swagger_css_url=_static(request, "swagger-ui.css"),
        swagger_favicon_url=_static(request, "favicon.png"),
        swagger_ui_parameters=app.swagger_ui_parameters,
    )


async def swagger_ui_redirect(request: Request) -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


async def redoc(request: Request) -> HTMLResponse:
    app: FastAPI = request.app
    return get_redoc_html(
        openapi_url=f"{request.scope.get('root_path', '')}{app.openapi_url}",
        title=f"{app.title} - ReDoc",
        redoc_js_url=_static(request, "redoc.standalone.js"),
        redoc_favicon_url=_static(request, "favicon.png"),
        with_google_fonts=False,
    )


def install_offline_docs(app: FastAPI) -> None:
    """The pages and their files, on an app made with docs_url=None and redoc_url=None."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static-offline-docs")
    # GET only, as FastAPI routes (a Starlette route would answer HEAD too, outside docs/ACCESS.md's matrix).
    for path, page in ((DOCS_URL, swagger_ui), (app.swagger_ui_oauth2_redirect_url, swagger_ui_redirect),
                       (REDOC_URL, redoc)):
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False, response_class=HTMLResponse)
