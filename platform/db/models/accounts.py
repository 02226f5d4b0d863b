"""Tenants and their API keys."""
from __future__ import annotations

import enum
import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from loraloom.platform.db.models.base import Base, enum_column, utcnow


class ApiKeyRole(str, enum.Enum):
    admin = "admin"  # everything in the tenant, including keys
    developer = "developer"  # manage adapters, aliases, training; run inference
    inference = "inference"  # inference only


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set by the operator: every key of the tenant is refused (403) until it is cleared (api/auth.py).
    suspended_at: Mapped[datetime | None]

    # Children are deleted with their parent by the database's ON DELETE CASCADE
    # (passive_deletes: the ORM does not load them first).
    api_keys: Mapped[list[ApiKey]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )
    adapters: Mapped[list[Adapter]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )
    # None: no limits set, the tenant is unlimited (platform/limits/).
    limits: Mapped[TenantLimits | None] = relationship(passive_deletes=True)


class ApiKey(Base):
    """A bearer key. Only its sha256 is stored (see api_keys.py); `prefix` is the visible start
    shown in listings so users can tell their keys apart."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[ApiKeyRole] = mapped_column(enum_column(ApiKeyRole, "api_key_role"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")
    limits: Mapped[ApiKeyLimits | None] = relationship(passive_deletes=True)

    def is_usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)
