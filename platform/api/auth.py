"""Who is calling: the `Authorization: Bearer <key>` of a request, checked against api_keys.

`authenticate` (CallerDep) answers 401 in OpenAI's error shape for a missing, malformed,
unknown, revoked or expired key; `require_role(...)` answers 403 naming the role needed.
Routes declare what they need:

    caller: CallerDep       # any valid key
    caller: DeveloperDep    # require_role("admin", "developer")
    caller: AdminDep        # require_role("admin")

The key itself is never logged nor echoed back; only its visible prefix appears in messages.
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraloom.platform.accounts import TenantNotFoundError, find_tenant
from loraloom.platform.api.dependencies import SessionFactoryDep
from loraloom.platform.api.errors import APIError
from loraloom.platform.db.api_keys import find_api_key
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant, utcnow

ROLES = tuple(role.value for role in ApiKeyRole)
# last_used_at is written at most this often per key: it says "in use lately", not an access log.
LAST_USED_RESOLUTION = timedelta(minutes=1)
BEARER_SCHEME = "bearer"

# Declared for the OpenAPI document (the "Authorize" button); the header is parsed below,
# so that a missing header and a malformed one get different messages.
_openapi_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ll-...`")


@dataclass(frozen=True)
class Caller:
    """Who a request acts as. `api_key_id` is None when the server itself acts for a tenant
    (e.g. a background job), never for an HTTP request."""

    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    role: str  # one of ROLES


@dataclass(frozen=True)
class KeyUse:
    api_key_id: uuid.UUID
    used_at: datetime


def unauthorized(message: str, code: str) -> APIError:
    return APIError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})


def bearer_token(authorization: str | None) -> str:
    """The key in an `Authorization: Bearer <key>` header value; 401 if missing or malformed."""
    if authorization is None or not authorization.strip():
        raise unauthorized(
            "Missing API key: send it as `Authorization: Bearer <key>` (loraloom keys create, or the "
            "admin key `loraloom serve` printed on first start)",
            code="missing_api_key",
        )
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != BEARER_SCHEME or not token or " " in token:
        raise unauthorized(
            "Malformed Authorization header: expected `Authorization: Bearer <key>` with one key",
            code="invalid_authorization_header",
        )
    return token


def find_key(session_factory: sessionmaker[Session], token: str) -> ApiKey | None:
    with session_factory() as session:
        return find_api_key(session, token)


def check_usable(key: ApiKey | None, now: datetime) -> ApiKey:
    """The key if it may be used now; 401 naming why not otherwise."""
    if key is None:
        raise unauthorized("Incorrect API key provided: no such key exists", code="invalid_api_key")
    if key.revoked_at is not None:
        raise unauthorized(
            f"The API key {key.prefix}... was revoked at {key.revoked_at.isoformat()}; use another key",
            code="api_key_revoked",
        )
    if key.expires_at is not None and now >= key.expires_at:
        raise unauthorized(
            f"The API key {key.prefix}... expired at {key.expires_at.isoformat()}; use another key",
            code="api_key_expired",
        )
    return key


async def authenticate(
    request: Request,
    session_factory: SessionFactoryDep,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_openapi_bearer)],
) -> Caller:
    token = bearer_token(request.headers.get("authorization"))
    # One indexed lookup by hash, in a worker thread: the event loop never waits on the database.
    key = await run_in_threadpool(find_key, session_factory, token)
    now = utcnow()
    key = check_usable(key, now)
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        request.app.state.key_use_writer.submit(KeyUse(api_key_id=key.id, used_at=now))
    caller = Caller(tenant_id=key.tenant_id, api_key_id=key.id, role=key.role.value)
    request.state.caller = caller  # for the audit middleware, which runs outside the route
    return caller


CallerDep = Annotated[Caller, Depends(authenticate)]


def require_role(*roles: str) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency that lets through keys with one of `roles` and answers 403 to the rest."""
    unknown = [role for role in roles if role not in ROLES]
    if not roles or unknown:
        raise ValueError(f"require_role: roles must be some of {ROLES}, got {roles}")

    async def check_role(caller: CallerDep) -> Caller:
        if caller.role not in roles:
            needed = " or ".join(repr(role) for role in roles)
            raise APIError(
                403,
                f"This request needs an API key with role {needed}; this key's role is {caller.role!r}",
                code="insufficient_role",
            )
        return caller

    return check_role


AdminDep = Annotated[Caller, Depends(require_role(ApiKeyRole.admin.value))]
DeveloperDep = Annotated[Caller, Depends(require_role(ApiKeyRole.admin.value, ApiKeyRole.developer.value))]


TenantQuery = Annotated[
    str | None, Query(description="A tenant's name; admin keys only. Default: the calling key's tenant.")
]


def tenant_in_scope(session: Session, caller: Caller, name: str | None) -> Tenant:
    """The tenant a request acts on: the caller's own, or (admin keys only) the one named."""
    own = session.get(Tenant, caller.tenant_id)
    if own is None:  # deleted while the key was in flight
        raise unauthorized("This API key's tenant no longer exists", code="invalid_api_key")
    if name is None or name == own.name:
        return own
    if caller.role != ApiKeyRole.admin.value:
        raise APIError(
            403,
            f"tenant: only admin keys may act on another tenant ({name!r}); omit tenant for your own",
            param="tenant",
            code="insufficient_role",
        )
    try:
        return find_tenant(session, name=name)
    except TenantNotFoundError as error:
        raise APIError(404, str(error), param="tenant", code="tenant_not_found") from None


def write_key_uses(session_factory: sessionmaker[Session], uses: Sequence[KeyUse]) -> None:
    """Move each key's last_used_at forward (never back: batches may land out of order)."""
    latest: dict[uuid.UUID, datetime] = {}
    for use in uses:
        latest[use.api_key_id] = max(use.used_at, latest.get(use.api_key_id, use.used_at))
    with session_factory.begin() as session:
        for key_id, used_at in latest.items():
            session.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, (ApiKey.last_used_at.is_(None)) | (ApiKey.last_used_at < used_at))
                .values(last_used_at=used_at)
            )
