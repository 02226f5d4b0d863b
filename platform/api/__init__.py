"""loraloom.platform.api: the OpenAI-compatible HTTP API (FastAPI).

`create_app` is imported on first use rather than here: the routers import
loraloom.platform.auth, which imports this package's errors and dependencies, so an
eager import would be a cycle whenever auth is imported first.
"""
from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from loraloom.platform.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
