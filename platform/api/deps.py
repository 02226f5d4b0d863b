"""Everything a route handler receives, as `Annotated` dependencies: the engine, the adapter
lookup, the adapter registry, the database and settings the app was created with, the
training job sender, the usage meter, and the caller (`authenticate`
answers 401 for a bad key, the role dependencies 403):

    caller: CallerDep       # any valid key
    caller: DeveloperDep    # an admin or developer key
    caller: AdminDep        # an admin key (of the caller's tenant, or the operator's)
    caller: OperatorDep     # the operator's admin key: acts on every tenant
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request, params
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraloom.engine import EngineClient
from loraloom.platform.accounts.keys import ROLES, Caller, KeyUse, is_operator_key
from loraloom.platform.api.auth import (
    LAST_USED_RESOLUTION,
    bearer_token,
    check_operator,
    check_role,
    check_usable,
    find_key,
    single_authorization,
)
from loraloom.platform.api.errors import APIError
from loraloom.platform.db.models import ApiKeyRole, utcnow
from loraloom.platform.json_input import lone_surrogate_message, lone_surrogate_path, may_hold_surrogates
from loraloom.platform.limits.policy import caller_limits
from loraloom.platform.metering.usage import UsageMeter
from loraloom.platform.registry.lookup import AdapterLookup
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import send_run_job


def get_engine(request: Request) -> EngineClient:
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


EngineDep = Annotated[EngineClient, Depends(get_engine)]
LookupDep = Annotated[AdapterLookup, Depends(get_lookup)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_registry(request: Request) -> RegistryService:
    """The adapter registry, for the routes that change it or read its blobs (adapters, files)."""
    registry: RegistryService | None = request.app.state.registry
    if registry is None:
        raise APIError(404, "This server has no adapter registry; it serves only the adapters given to it at start")
    return registry


def get_job_sender(request: Request) -> Callable[[str], None]:
    """Sends a created job to the training workers (the app's Celery app; a fake in tests)."""
    app: Celery = request.app.state.training_app
    return lambda job_id: send_run_job(app, job_id)


RegistryDep = Annotated[RegistryService, Depends(get_registry)]
JobSenderDep = Annotated[Callable[[str], None], Depends(get_job_sender)]


# ------------------------------------------------------------------ the caller
# Declared for the OpenAPI document (the "Authorize" button); the header is parsed by
# bearer_token, so that a missing header and a malformed one get different messages.
_openapi_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ll-...`")


async def authenticate(
    request: Request,
    session_factory: SessionFactoryDep,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_openapi_bearer)],
) -> Caller:
    token = bearer_token(single_authorization(request.headers.getlist("authorization")))
    # One indexed lookup by hash, in a worker thread: the event loop never waits on the database.
    key = await run_in_threadpool(find_key, session_factory, token)
    now = utcnow()
    key = check_usable(key, now)
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        request.app.state.key_use_writer.submit(KeyUse(api_key_id=key.id, used_at=now))
    limits = caller_limits(key)  # loaded with the key: no second query
    caller = Caller(
        tenant_id=key.tenant_id, api_key_id=key.id, role=key.role.value,
        operator=is_operator_key(key, key.tenant.name), tenant_name=key.tenant.name,
        share_weight=limits.share_weight,
    )
    request.state.caller = caller  # for the audit middleware, which runs outside the route
    request.state.caller_limits = limits  # for the rate limits (api/rate_limits.py)
    return caller


CallerDep = Annotated[Caller, Depends(authenticate)]


def require_role(*roles: str) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency that lets through keys with one of `roles` and answers 403 to the rest."""
    unknown = [role for role in roles if role not in ROLES]
    if not roles or unknown:
        raise ValueError(f"require_role: roles must be some of {ROLES}, got {roles}")

    async def check_caller_role(caller: CallerDep) -> Caller:
        return check_role(caller, roles)

    return check_caller_role


AdminDep = Annotated[Caller, Depends(require_role(ApiKeyRole.admin.value))]


async def _operator(caller: AdminDep) -> Caller:
    return check_operator(caller)


OperatorDep = Annotated[Caller, Depends(_operator)]
DeveloperDep = Annotated[Caller, Depends(require_role(ApiKeyRole.admin.value, ApiKeyRole.developer.value))]

# ------------------------------------------------------------------ the body
async def refuse_lone_surrogates(request: Request) -> None:
    """400 naming the field for a JSON body string holding a lone surrogate ("\\ud800"): json.loads
    accepts it, and the tokenizer or the database driver then failed on it with a 500."""
    if "json" not in request.headers.get("content-type", "") or not may_hold_surrogates(await request.body()):
        return
    try:
        body = await request.json()  # parsed once: FastAPI's own parse is cached on the request
    except (ValueError, RecursionError):
        return  # FastAPI answers an unparsable body itself
    path = lone_surrogate_path(body)
    if path is not None:
        raise APIError(400, lone_surrogate_message(path or "the request body"), param=path or None)


# ------------------------------------------------------------------ usage metering
def usage_meter(endpoint: str) -> params.Depends:
    """A dependency giving a fresh UsageMeter for `endpoint`, started when the request arrives."""

    def start_meter(request: Request, caller: CallerDep) -> UsageMeter:
        meter = UsageMeter(writer=request.app.state.usage_writer, caller=caller, endpoint=endpoint)
        request.state.usage_meter = meter  # the request's log line reads its adapter and tokens
        return meter

    return Depends(start_meter)


ChatUsageMeterDep = Annotated[UsageMeter, usage_meter("chat.completions")]
CompletionUsageMeterDep = Annotated[UsageMeter, usage_meter("completions")]
