"""Tenants and API keys: the service functions behind /v1/tenants, /v1/keys, the bootstrap
admin key of `loraloom serve` and `loraloom admin create-key`.

Functions take a session and keyword-only arguments; they add and flush, the caller commits.
"""
from __future__ import annotations

import re
import uuid
from datetime import datetime

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from loraloom.platform.db.api_keys import create_api_key
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant, utcnow

DEFAULT_TENANT = "default"
BOOTSTRAP_KEY_NAME = "bootstrap"
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class TenantExistsError(ValueError):
    """POST /v1/tenants with a name in use: 409."""


class TenantNotFoundError(LookupError):
    """A tenant named in a request does not exist: 404."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} does not exist; GET /v1/tenants lists them, POST /v1/tenants creates one")


def check_tenant_name(name: str) -> str:
    if TENANT_NAME.fullmatch(name) is None:
        raise ValueError(
            f"name: {name!r} is not a valid tenant name; use 1-64 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def find_tenant(session: Session, *, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise TenantNotFoundError(name)
    return tenant


def create_tenant(session: Session, *, name: str) -> Tenant:
    check_tenant_name(name)
    if session.scalar(select(exists().where(Tenant.name == name))):
        raise TenantExistsError(f"name: a tenant named {name!r} already exists")
    tenant = Tenant(name=name)
    session.add(tenant)
    session.flush()
    return tenant


def get_or_create_tenant(session: Session, *, name: str) -> Tenant:
    try:
        return find_tenant(session, name=check_tenant_name(name))
    except TenantNotFoundError:
        return create_tenant(session, name=name)


def list_tenants(session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.name)))


def issue_key(
    session: Session, *, tenant: Tenant, name: str, role: ApiKeyRole, expires_at: datetime | None
) -> tuple[ApiKey, str]:
    """A new key for `tenant`: the row and the plaintext, which exists nowhere else after this returns."""
    if expires_at is not None and expires_at <= utcnow():
        raise ValueError(f"expires_at: {expires_at.isoformat()} is in the past; give a future time or none")
    key, plaintext = create_api_key(session, tenant_id=tenant.id, name=name, role=role, expires_at=expires_at)
    session.flush()
    return key, plaintext


def list_keys(session: Session, *, tenant_id: uuid.UUID) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)))


def revoke_key(session: Session, *, key_id: uuid.UUID) -> ApiKey | None:
    """Revoke the key (at once for every later request); None if there is no such key.
    Revoking a revoked key keeps its first revocation time."""
    key = session.get(ApiKey, key_id)
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
