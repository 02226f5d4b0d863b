"""Tenants: the service functions behind /v1/tenants, and the tenant a new key is made for.

Functions take a session and keyword-only arguments; they add and flush, the caller commits.
"""
from __future__ import annotations

import re

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from loraloom.engine import RequestFieldError
from loraloom.platform.db.models import Tenant, utcnow

DEFAULT_TENANT = "default"
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class TenantExistsError(ValueError):
    """POST /v1/tenants with a name in use: 409."""


class OperatorTenantSuspensionError(ValueError):
    """Suspending the operator's own tenant would lock every operator key out, with no key left to resume it."""


class TenantNotFoundError(LookupError):
    """A tenant named in a request does not exist: 404."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} does not exist; GET /v1/tenants lists them, POST /v1/tenants creates one")


def check_tenant_name(name: str) -> str:
    if TENANT_NAME.fullmatch(name) is None:
        raise RequestFieldError(
            "name", f"{name!r} is not a valid tenant name; use 1-64 lowercase letters, digits, '-' or '_', "
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


def set_suspended(session: Session, *, name: str, suspended: bool) -> Tenant:
    """Suspend (every key refused, open streams ended: api/auth.py, api/revocation.py) or resume a tenant.
    Repeating either is a no-op that keeps the first suspension's time."""
    tenant = find_tenant(session, name=name)
    if suspended and tenant.name == DEFAULT_TENANT:
        raise OperatorTenantSuspensionError(
            f"tenant: {name!r} is the operator's tenant; suspending it would refuse the keys needed to resume it"
        )
    if not suspended:
        tenant.suspended_at = None
    elif tenant.suspended_at is None:
        tenant.suspended_at = utcnow()
    session.flush()
    return tenant
