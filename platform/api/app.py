"""create_app: the OpenAI-compatible HTTP API over one AsyncEngine."""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.lora import AdapterLoadError
from loraloom.platform.adapter_lookup import AdapterLookup
from loraloom.platform.api import chat, completions, models, operations
from loraloom.platform.api.body_limit import BodySizeLimit
from loraloom.platform.api.errors import install_error_handlers
from loraloom.platform.api.metrics import engine_metrics_registry

logger = logging.getLogger(__name__)


async def preload_adapters(engine: AsyncEngine, lookup: AdapterLookup) -> None:
    """Load every adapter the lookup lists into the engine's host cache. One that
    fails is logged with the loader's message and skipped; requests naming it
    get that message as a 400."""
    for adapter in await run_in_threadpool(lookup.list_adapters):
        try:
            await engine.load_adapter(adapter)
        except AdapterLoadError as error:
            logger.error("adapter %r (%s) not loaded: %s", adapter.name, adapter.uri, error)


def create_app(engine: AsyncEngine, lookup: AdapterLookup) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            await preload_adapters(engine, lookup)
            yield
        finally:
            await engine.shutdown()

    app = FastAPI(title="loraloom", summary="OpenAI-compatible multi-LoRA serving", lifespan=lifespan)
    app.state.engine = engine
    app.state.lookup = lookup
    app.state.metrics_registry = engine_metrics_registry(engine.stats)
    app.state.created = int(time.time())
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit)
    for router in (chat.router, completions.router, models.router, operations.router):
        app.include_router(router)
    return app
