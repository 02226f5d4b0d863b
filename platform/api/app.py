"""create_app: the OpenAI-compatible HTTP API over one EngineClient, with its control-plane database."""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import iter_route_contexts
from starlette.concurrency import run_in_threadpool

from loraloom.engine import AdapterLoadError, EngineClient
from loraloom.platform.accounts.keys import write_key_uses
from loraloom.platform.api.allowed_methods import install_allow_header
from loraloom.platform.api.console import install_console
from loraloom.platform.api.deps import authenticate, refuse_lone_surrogates
from loraloom.platform.api.errors import install_error_handlers
from loraloom.platform.api.middleware import AuditMiddleware, BodySizeLimit
from loraloom.platform.api.offline_docs import install_offline_docs
from loraloom.platform.api.openapi import install_contract
from loraloom.platform.api.overload import OverloadGuard, default_max_waiting
from loraloom.platform.api.rate_limits import RateLimitHeaders, RateLimits
from loraloom.platform.api.request_log import RequestLogMiddleware
from loraloom.platform.api.response_metrics import ResponseMetrics
from loraloom.platform.api.routes import (
    adapter_downloads,
    adapters,
    admin,
    chat,
    completions,
    engine_status,
    files,
    fine_tuning,
    limits,
    me,
    models,
    operations,
    usage,
    usage_latency,
    usage_series,
)
from loraloom.platform.api.revocation import KeyWatch
from loraloom.platform.api.security_headers import SecurityHeaders
from loraloom.platform.api.schemas.common import ErrorResponse
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.change_listener import InProcessChangeListener, PostgresChangeListener
from loraloom.platform.limits.admission import Gate
from loraloom.platform.limits.factory import create_limiter
from loraloom.platform.limits.quota import month_usage
from loraloom.platform.metering.audit import write_audit_entries
from loraloom.platform.metering.batch_writer import BatchWriter, DroppedRecordsCollector
from loraloom.platform.metering.change_metrics import ChangeListenerCollector
from loraloom.platform.metering.engine_metrics import engine_metrics_registry
from loraloom.platform.metering.http_metrics import HttpResponseCounts
from loraloom.platform.metering.throttle_metrics import ThrottledRequests
from loraloom.platform.metering.training_metrics import TrainingCollector
from loraloom.platform.metering.usage import write_usage_records
from loraloom.platform.registry.lookup import AdapterLookup
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import create_celery_app
from loraloom.platform.training.supervisor import TrainingSupervisor

logger = logging.getLogger(__name__)

# Every router here serves /v1 paths and requires an API key. operations: /health is open, /metrics takes
# the operator's key itself (its OperatorDep); who may call what is api/access.py.
AUTHENTICATED_ROUTERS = (
    chat.router, completions.router, models.router, admin.router, usage.router, adapters.router, files.router,
    fine_tuning.router, adapter_downloads.router, me.router, engine_status.router, usage_series.router,
    usage_latency.router,
    limits.router,
)
OPEN_ROUTERS = (operations.router,)
API_PREFIX = "/v1/"
# A writer holds at most this many batches in memory while the database is unreachable.
MAX_PENDING_BATCHES = 200


async def preload_adapters(engine: EngineClient, lookup: AdapterLookup) -> None:
    """Load every adapter the lookup lists into the engine's host cache. One that
    fails is logged with the loader's message and skipped; requests naming it
    get that message as a 400."""
    for adapter in await run_in_threadpool(lookup.list_adapters):
        try:
            await engine.load_adapter(adapter)
        except AdapterLoadError as error:
            logger.error("adapter %r (%s) not loaded: %s", adapter.name, adapter.uri, error)


def rate_limits(settings: Settings, session_factory: Any) -> RateLimits:
    """The gateway's rate limits over the limiter its settings choose (memory, or Redis)."""

    async def read_month_usage(tenant_id: Any, now: Any) -> int:
        def read() -> int:
            with session_factory() as session:
                return month_usage(session, tenant_id, now)

        return await run_in_threadpool(read)

    max_waiting = settings.max_waiting_requests
    return RateLimits(
        Gate(create_limiter(settings), read_month_usage),
        OverloadGuard(default_max_waiting() if max_waiting is None else max_waiting),
        ThrottledRequests(),
    )


def _depends_on(dependant: Dependant, dependency: Any) -> bool:
    return any(sub.call is dependency or _depends_on(sub, dependency) for sub in dependant.dependencies)


def check_api_routes_authenticated(app: FastAPI) -> None:
    """Refuse to build an app with a /v1 route that does not authenticate its caller."""
    # Route contexts, not app.routes: they carry the dependencies of the routers a route was included through.
    for route in iter_route_contexts(app.routes):
        dependant = getattr(route, "dependant", None)  # None: Starlette's own routes (docs, openapi.json)
        path = getattr(route, "path", "")
        if dependant is not None and path.startswith(API_PREFIX) and not _depends_on(dependant, authenticate):
            raise RuntimeError(
                f"{sorted(getattr(route, 'methods', ()))} {path} is served without authentication; "
                "add its router to AUTHENTICATED_ROUTERS in platform/api/app.py"
            )


def api_app(**options: Any) -> FastAPI:
    """The app's routes, error handlers and OpenAPI document, with nothing running behind them: what
    create_app serves, and what `python -m loraloom.platform.api.openapi_file` writes the document of.
    `options` go to FastAPI (create_app's lifespan)."""
    app = FastAPI(title="loraloom", summary="OpenAI-compatible multi-LoRA serving", docs_url=None, redoc_url=None,
                  **options)
    install_offline_docs(app)  # /docs and /redoc, loading offline
    install_error_handlers(app)  # first: its middleware is then the innermost
    install_allow_header(app)
    authenticated = APIRouter(
        dependencies=[Depends(authenticate), Depends(refuse_lone_surrogates)],
        responses={status: {"model": ErrorResponse} for status in (401, 403)},
    )
    for router in AUTHENTICATED_ROUTERS:
        authenticated.include_router(router)
    app.include_router(authenticated)
    for router in OPEN_ROUTERS:
        app.include_router(router)
    install_console(app)  # /console, and / redirecting there
    check_api_routes_authenticated(app)
    install_contract(app)
    return app


def create_app(
    engine: EngineClient,
    lookup: AdapterLookup,
    settings: Settings,
    *,
    registry: RegistryService | None = None,
    training: TrainingSupervisor | None = None,
) -> FastAPI:
    """The app serving `engine`; tenants, keys, usage and audit live in `settings.database_url`,
    which must already be migrated (`loraloom db upgrade`; `loraloom serve` does it). `registry`: the
    adapter registry the adapter and file routes change (composition.py builds it with `lookup`);
    without one those routes answer 404 and only `lookup`'s adapters are served. `training`, the
    supervisor of serve's training side, is what /health reports of training."""
    db_engine = create_db_engine(settings.database_url)
    session_factory = create_session_factory(db_engine)
    # What keeps the lookup's cache honest about changes other gateways make; nothing to run without a
    # registry (only the adapters given at start, which never change).
    changes = registry.changes if registry is not None else InProcessChangeListener()

    def record_writer(name: str, write: Any) -> BatchWriter[Any]:
        return BatchWriter(
            functools.partial(write, session_factory),
            name=name,
            flush_interval_s=settings.record_flush_interval_ms / 1000,
            max_batch=settings.record_batch_size,
            max_pending=settings.record_batch_size * MAX_PENDING_BATCHES,
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Made here, not in create_app: they run on the server's event loop, once per start.
        app.state.usage_writer = record_writer("usage", write_usage_records)
        app.state.audit_writer = record_writer("audit", write_audit_entries)
        app.state.key_use_writer = record_writer("api-key last-used", write_key_uses)
        writers = (app.state.usage_writer, app.state.audit_writer, app.state.key_use_writer)
        for writer in writers:
            writer.start()
        changes.start()
        app.state.key_watch.start()
        await engine.start()
        try:
            await preload_adapters(engine, lookup)
            yield
        finally:
            await engine.shutdown()  # ends the streams, whose usage rows are submitted as they end
            await app.state.key_watch.stop()
            await run_in_threadpool(changes.stop)
            for writer in writers:
                await writer.close()
            await app.state.rate_limits.settled()
            await app.state.rate_limits.gate.limiter.close()
            db_engine.dispose()

    app = api_app(lifespan=lifespan)
    app.state.engine = engine
    app.state.lookup = lookup
    app.state.registry = registry
    app.state.session_factory = session_factory
    app.state.settings = settings
    app.state.training = training
    # Ends the generations of a key revoked (through any gateway) or expired while they run.
    app.state.key_watch = KeyWatch(session_factory)
    # Sends training jobs to the workers (`loraloom worker`, or the one `loraloom serve` starts).
    app.state.training_app = create_celery_app(settings)
    # An engine client over several replicas (platform/ray_serve) reads each one's stats too: their
    # series carry a `replica` label (metering/engine_metrics.py).
    app.state.metrics_registry = engine_metrics_registry(engine.stats, getattr(engine, "stats_by_replica", None))
    app.state.metrics_registry.register(DroppedRecordsCollector(
        lambda: [getattr(app.state, name) for name in ("usage_writer", "audit_writer", "key_use_writer")
                 if hasattr(app.state, name)]  # made at start-up
    ))
    if isinstance(changes, PostgresChangeListener):
        app.state.metrics_registry.register(ChangeListenerCollector(changes))
    app.state.metrics_registry.register(TrainingCollector(session_factory))
    app.state.rate_limits = rate_limits(settings, session_factory)
    app.state.metrics_registry.register(app.state.rate_limits.throttled)
    app.state.created = int(time.time())
    app.add_middleware(AuditMiddleware)
    # An oversized body is refused before anything else reads it.
    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_request_body_bytes,
                       max_upload_bytes=settings.adapter_upload_max_bytes)
    app.add_middleware(RateLimitHeaders)
    # CSP, no framing, nosniff, no referrer on every response, the refusals above included.
    app.add_middleware(SecurityHeaders)
    # Counts what the client finally got, the refusals of the middlewares above included.
    response_counts = HttpResponseCounts()
    app.state.metrics_registry.register(response_counts)
    app.add_middleware(ResponseMetrics, counts=response_counts)
    # Outermost: every request gets its id first (the audit log records it) and is logged last.
    app.add_middleware(RequestLogMiddleware)
    return app
