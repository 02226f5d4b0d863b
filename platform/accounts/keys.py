"""API keys and who a request acts as: the service functions behind /v1/keys, the bootstrap
admin key of `loraloom serve`, `loraloom admin create-key`, and the keys' last-used times.

Functions take a session and keyword-only arguments; they add and flush, the caller commits.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine import RequestFieldError
from loraloom.platform.accounts.tenants import DEFAULT_TENANT, get_or_create_tenant
from loraloom.platform.db.api_keys import create_api_key
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant, utcnow

BOOTSTRAP_KEY_NAME = "bootstrap"
ROLES = tuple(role.value for role in ApiKeyRole)
# The operator runs the server for every tenant: its admin keys (the bootstrap key among them) act on
# any tenant. An admin key of any other tenant administers that tenant only.
OPERATOR_TENANT = DEFAULT_TENANT


@dataclass(frozen=True)
class Caller:
    """Who a request acts as. `api_key_id` is None when the server itself acts for a tenant
    (e.g. a background job), never for an HTTP request."""

    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    role: str  # one of ROLES
    operator: bool = False  # an admin key of OPERATOR_TENANT: may act on every tenant
    tenant_name: str = ""  # as the API shows it: the tenant label of the engine's metrics
    # The tenant's weight in the engine's fair share (VTC): its token counter is charged 1/weight per
    # token, so weight 2 gets twice the tokens of weight 1 while both wait. Set by the operator.
    share_weight: float = 1.0


def is_operator_key(key: ApiKey, tenant_name: str) -> bool:
    return key.role is ApiKeyRole.admin and tenant_name == OPERATOR_TENANT


@dataclass(frozen=True)
class KeyUse:
    """A key was used at `used_at`: batched by the API into write_key_uses."""

    api_key_id: uuid.UUID
    used_at: datetime


def issue_key(
    session: Session, *, tenant: Tenant, name: str, role: ApiKeyRole, expires_at: datetime | None
) -> tuple[ApiKey, str]:
    """A new key for `tenant`: the row and the plaintext, which exists nowhere else after this returns."""
    if expires_at is not None and expires_at <= utcnow():
        raise RequestFieldError("expires_at", f"{expires_at.isoformat()} is in the past; give a future time or none")
    key, plaintext = create_api_key(session, tenant_id=tenant.id, name=name, role=role, expires_at=expires_at)
    session.flush()
    return key, plaintext


def list_keys(session: Session, *, tenant_id: uuid.UUID) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)))


def revoke_key(session: Session, *, key_id: uuid.UUID, tenant_id: uuid.UUID | None) -> ApiKey | None:
    """Revoke the key (at once for every later request); None if there is no such key in `tenant_id`
    (None: in any tenant, for the operator). Revoking a revoked key keeps its first revocation time."""
    key = session.get(ApiKey, key_id)
    if key is not None and tenant_id is not None and key.tenant_id != tenant_id:
        return None  # another tenant's key answers exactly like a missing one
    if key is not None and key.revoked_at is None:
        key.revoked_at = utcnow()
        session.flush()
    return key


def create_key_for_tenant(
    session: Session, *, tenant_name: str, key_name: str, role: ApiKeyRole
) -> tuple[ApiKey, str]:
    """`loraloom admin create-key`: the tenant is created if it does not exist yet."""
    tenant = get_or_create_tenant(session, name=tenant_name)
    return issue_key(session, tenant=tenant, name=key_name, role=role, expires_at=None)


def create_bootstrap_admin_key(session: Session) -> str | None:
    """On a database that has never had an admin key: tenant "default" and an admin key, whose
    plaintext is returned; None (and nothing created) otherwise, so only a first start makes one."""
    if session.scalar(select(exists().where(ApiKey.role == ApiKeyRole.admin))):
        return None
    _, plaintext = create_key_for_tenant(
        session, tenant_name=DEFAULT_TENANT, key_name=BOOTSTRAP_KEY_NAME, role=ApiKeyRole.admin
    )
    return plaintext


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
