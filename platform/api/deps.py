"""What route handlers receive: the engine, the adapter lookup and the database the app was created with."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.async_engine import AsyncEngine
from loraloom.platform.adapter_lookup import AdapterLookup
from loraloom.platform.settings import Settings


def get_engine(request: Request) -> AsyncEngine:
    return request.app.state.engine


def get_lookup(request: Request) -> AdapterLookup:
    return request.app.state.lookup


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session_factory(request: Request) -> sessionmaker[Session]:
    return request.app.state.session_factory


def get_session(session_factory: Annotated[sessionmaker[Session], Depends(get_session_factory)]) -> Iterator[Session]:
    """One session per request, closed after the response. Routes that use it are plain `def`
    (FastAPI runs them in a worker thread), so database calls never block the event loop."""
    with session_factory() as session:
        yield session


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]
LookupDep = Annotated[AdapterLookup, Depends(get_lookup)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
