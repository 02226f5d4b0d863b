"""The web console (web/, built into web/dist by `make setup`), served at /console by the API's
own server, with / redirecting there. The console is a client of the public API only: these
routes serve files and nothing else.

Client-side routes (/console/adapters/x) have no file of their own: they get index.html,
whose script reads the path. Vite names built assets by their content hash, so those are
cached for good; index.html is always revalidated so a rebuild is picked up at once.
"""
from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse, Response

# platform/api/console.py -> the repository root (the package is installed in editable mode).
DEFAULT_DIST = Path(__file__).resolve().parents[2] / "web" / "dist"
MOUNT = "/console"
NOT_BUILT = (
    "The web console is not built: run `make setup` (or `npm ci && npm run build` in web/), "
    "then reload. The API itself works: see /docs."
)


def console_dist() -> Path:
    return Path(os.environ.get("LORALOOM_CONSOLE_DIST", DEFAULT_DIST))


def _file_in(dist: Path, relative: str) -> Path | None:
    """The file `relative` names inside dist, or None (missing, a directory, or outside dist)."""
    candidate = (dist / relative).resolve()
    if candidate.is_file() and candidate.is_relative_to(dist.resolve()):
        return candidate
    return None


def console_router(dist: Path) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def root() -> Response:
        return RedirectResponse(f"{MOUNT}/")

    @router.get(MOUNT)
    @router.get(MOUNT + "/{path:path}")
    def console(path: str = "") -> Response:
        index = dist / "index.html"
        if not index.is_file():
            return PlainTextResponse(NOT_BUILT, status_code=503)
        found = _file_in(dist, path) if path else None
        if found is None:
            return FileResponse(index, headers={"Cache-Control": "no-cache"})
        immutable = path.startswith("assets/")
        return FileResponse(found, headers={"Cache-Control": "public, max-age=31536000, immutable" if immutable
                                            else "no-cache"})

    return router


def install_console(app: FastAPI, dist: Path | None = None) -> None:
    app.include_router(console_router(dist or console_dist()))
