"""What route handlers receive: the engine and the adapter lookup the app was created with."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from loraloom.engine.async_engine import AsyncEngine
from loraloom.platform.adapter_lookup import AdapterLookup


def get_engine(request: Request) -> AsyncEngine:
    return request.app.state.engine


def get_lookup(request: Request) -> AdapterLookup:
    return request.app.state.lookup


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]
LookupDep = Annotated[AdapterLookup, Depends(get_lookup)]
