"""Who is calling: the checks behind `authenticate` (api/deps.py), which reads the
`Authorization: Bearer <key>` of a request and looks the key up in api_keys.

A missing, malformed, unknown, revoked or expired key is a 401 in OpenAI's error shape; the
key itself is never logged nor echoed back, only its visible prefix appears in messages.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.accounts.keys import OPERATOR_TENANT, Caller
from loraloom.platform.accounts.tenants import find_tenant
from loraloom.platform.api.errors import APIError
from loraloom.platform.db.api_keys import find_api_key
from loraloom.platform.db.models import ApiKey, Tenant

# last_used_at is written at most this often per key: it says "in use lately", not an access log.
LAST_USED_RESOLUTION = timedelta(minutes=1)
BEARER_SCHEME = "bearer"


def unauthorized(message: str, code: str) -> APIError:
    return APIError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})


def single_authorization(values: list[str]) -> str | None:
    """The one Authorization header's value; 401 for several, which proxies and servers may each
    read differently (the first, the last, joined): a request must not be able to pick."""
    if len(values) > 1:
        raise unauthorized(
            f"The request has {len(values)} Authorization headers; send exactly one `Authorization: Bearer <key>`",
            code="invalid_authorization_header",
        )
    return values[0] if values else None


def bearer_token(authorization: str | None) -> str:
    """The key in an `Authorization: Bearer <key>` header value; 401 if missing or malformed."""
    if authorization is None or not authorization.strip():
        raise unauthorized(
            "Missing API key: send it as `Authorization: Bearer <key>` (loraloom keys create, or the "
            "admin key `loraloom serve` wrote to <data dir>/bootstrap-admin-key on first start)",
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
    """The key if it may be used now; 401 naming why not otherwise (403 for a suspended tenant).
    The key's tenant must be loaded with it (db/api_keys.py find_api_key does)."""
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
    if key.tenant.suspended_at is not None:
        # A 403, not a 401: the key is valid, its tenant is not allowed in; another key of it would fare the same.
        raise APIError(
            403,
            f"The tenant {key.tenant.name!r} of this API key was suspended by the operator at "
            f"{key.tenant.suspended_at.isoformat()}; its keys are refused until the operator resumes it",
            code="tenant_suspended",
        )
    return key


def check_role(caller: Caller, roles: tuple[str, ...]) -> Caller:
    """The caller if its key has one of `roles`; 403 naming the role needed otherwise."""
    if caller.role not in roles:
        needed = " or ".join(repr(role) for role in roles)
        raise APIError(
            403,
            f"This request needs an API key with role {needed}; this key's role is {caller.role!r}",
            code="insufficient_role",
        )
    return caller


def check_operator(caller: Caller) -> Caller:
    """The caller if its key is the operator's; 403 otherwise (a tenant's admin key included)."""
    if not caller.operator:
        raise APIError(
            403,
            f"This request needs the operator's key (an admin key of tenant {OPERATOR_TENANT!r}, such as the "
            "bootstrap key); an admin key of another tenant administers its own tenant only",
            code="operator_only",
        )
    return caller


def tenant_in_scope(session: Session, caller: Caller, name: str | None) -> Tenant:
    """The tenant a request acts on: the caller's own, or (the operator only) the one named.
    Anyone else naming another tenant gets a 403 before any lookup, whether that tenant exists
    or not, so the answer tells nothing of other tenants."""
    own = session.get(Tenant, caller.tenant_id)
    if own is None:  # deleted while the key was in flight
        raise unauthorized("This API key's tenant no longer exists", code="invalid_api_key")
    if name is None or name == own.name:
        return own
    if not caller.operator:
        raise APIError(
            403,
            f"tenant: only the operator's keys may act on another tenant ({name!r}); this key acts on its own "
            "tenant only: omit tenant",
            param="tenant",
            code="insufficient_role",
        )
    return find_tenant(session, name=name)  # none of that name: TenantNotFoundError, a 404 (errors.py)
