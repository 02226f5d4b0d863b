"""Rate limits and quotas an operator sets for a tenant or one of its keys (platform/limits/)."""
from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Double, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from loraloom.platform.db.models.base import Base, utcnow


# The limits both a tenant and a key may have.
PER_MINUTE_AND_CONCURRENT = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")


def _at_least_one(*columns: str) -> tuple[CheckConstraint, ...]:
    return tuple(CheckConstraint(f"{column} >= 1", name=column) for column in columns)


class TenantLimits(Base):
    """What an operator allows a tenant (platform/limits/). A column left None is unlimited; a tenant
    without a row is unlimited and has weight 1."""

    __tablename__ = "tenant_limits"
    __table_args__ = (
        *_at_least_one(*PER_MINUTE_AND_CONCURRENT, "max_training_jobs", "monthly_tokens"),
        CheckConstraint("share_weight > 0", name="share_weight"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_requests: Mapped[int | None]
    max_training_jobs: Mapped[int | None]  # jobs running at once; the rest wait queued
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger)  # input + output tokens per UTC month
    share_weight: Mapped[float] = mapped_column(Double, default=1.0)  # the engine's fair share (VTC)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ApiKeyLimits(Base):
    """Limits of one API key, on top of its tenant's: a request must fit both."""

    __tablename__ = "api_key_limits"
    __table_args__ = _at_least_one(*PER_MINUTE_AND_CONCURRENT)

    api_key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_requests: Mapped[int | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
