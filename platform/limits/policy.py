"""What an operator allows: reading and setting the limits of a tenant or of an API key in the
database (tenant_limits, api_key_limits), and the limits a request is held to.

Every limit is optional: None means unlimited. A request must fit its tenant's limits and its
key's. Functions take a session and keyword-only arguments; they flush, the caller commits.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, fields

from sqlalchemy.orm import Session

from loraloom.engine import RequestFieldError
from loraloom.platform.db.models import MAX_INT64, PER_MINUTE_AND_CONCURRENT, ApiKey, ApiKeyLimits, TenantLimits

DEFAULT_SHARE_WEIGHT = 1.0
# Limits both a tenant and a key may have; the tenant's alone are its training jobs, quota and weight.
KEY_LIMIT_FIELDS = PER_MINUTE_AND_CONCURRENT
TENANT_LIMIT_FIELDS = (*KEY_LIMIT_FIELDS, "max_training_jobs", "monthly_tokens")


@dataclass(frozen=True)
class Limits:
    """One scope's limits (a tenant's or a key's); None = unlimited. A key's has no training jobs,
    quota or weight: those stay None (weight: the tenant's)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    max_training_jobs: int | None = None
    monthly_tokens: int | None = None
    share_weight: float | None = None

    @classmethod
    def of(cls, row: TenantLimits | ApiKeyLimits | None) -> Limits:
        if row is None:
            return cls()
        return cls(**{field.name: getattr(row, field.name, None) for field in fields(cls)})


UNLIMITED = Limits()


@dataclass(frozen=True)
class CallerLimits:
    """What one request is held to: its tenant's limits and its key's."""

    tenant: Limits = UNLIMITED
    key: Limits = UNLIMITED

    @property
    def share_weight(self) -> float:
        return self.tenant.share_weight or DEFAULT_SHARE_WEIGHT


def caller_limits(key: ApiKey) -> CallerLimits:
    """From a key whose `limits` and `tenant.limits` were loaded with it (db.api_keys.find_api_key)."""
    return CallerLimits(tenant=Limits.of(key.tenant.limits), key=Limits.of(key.limits))


def check_limit(name: str, value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_INT64:
        raise RequestFieldError(name, f"{value} is not a valid limit; give a whole number from 1 to {MAX_INT64}, "
                                      "or null for no limit")
    return value


def check_share_weight(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise RequestFieldError("share_weight", f"{value} is not a valid weight; give a number above 0 "
                                "(1 is the default share, 2 twice that)")
    return value


def tenant_limits(session: Session, tenant_id: uuid.UUID) -> Limits:
    return Limits.of(session.get(TenantLimits, tenant_id))


def key_limits(session: Session, key_id: uuid.UUID) -> Limits:
    return Limits.of(session.get(ApiKeyLimits, key_id))


def set_tenant_limits(session: Session, *, tenant_id: uuid.UUID, limits: Limits) -> Limits:
    """Replace the tenant's limits with `limits` (None fields: unlimited; weight None: the default)."""
    for name in TENANT_LIMIT_FIELDS:
        check_limit(name, getattr(limits, name))
    weight = check_share_weight(DEFAULT_SHARE_WEIGHT if limits.share_weight is None else limits.share_weight)
    row = session.get(TenantLimits, tenant_id) or TenantLimits(tenant_id=tenant_id)
    for name in TENANT_LIMIT_FIELDS:
        setattr(row, name, getattr(limits, name))
    row.share_weight = weight
    session.add(row)
    session.flush()
    return Limits.of(row)


def set_key_limits(session: Session, *, key_id: uuid.UUID, limits: Limits) -> Limits:
    """Replace the key's limits with `limits`; a tenant-only field set there is a RequestFieldError naming it."""
    for name in ("max_training_jobs", "monthly_tokens", "share_weight"):
        if getattr(limits, name) is not None:
            raise RequestFieldError(name, "applies to a whole tenant, not to one key; set it on the tenant's limits")
    for name in KEY_LIMIT_FIELDS:
        check_limit(name, getattr(limits, name))
    row = session.get(ApiKeyLimits, key_id) or ApiKeyLimits(api_key_id=key_id)
    for name in KEY_LIMIT_FIELDS:
        setattr(row, name, getattr(limits, name))
    session.add(row)
    session.flush()
    return Limits.of(row)
