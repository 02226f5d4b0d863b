"""The two log tables: usage_records (tokens metered per request) and audit_log (mutating API calls).

They keep plain ids without foreign keys on purpose: billing and audit history must outlive the
tenants, keys and adapters they mention."""
from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Double, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from loraloom.platform.db.models.base import Base, BigIntId, enum_column, utcnow


class UsageStatus(str, enum.Enum):
    ok = "ok"  # generation ended normally (stop or length)
    error = "error"  # the engine refused or failed the request
    aborted = "aborted"  # the client went away (or the server shut down) before the end


class UsageRecord(Base):
    """Tokens metered for one inference request."""

    __tablename__ = "usage_records"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    tenant_id: Mapped[uuid.UUID]
    api_key_id: Mapped[uuid.UUID | None]
    adapter_version_id: Mapped[uuid.UUID | None]  # None: the base model, a checkpoint or a server-local adapter
    # The engine's runtime adapter key (tenant and content digest), for operators; never shown to users.
    adapter_key: Mapped[str | None] = mapped_column(String(256))
    # The adapter as the tenant knows it (what /v1/usage groups by); all None: the base model.
    adapter_name: Mapped[str | None] = mapped_column(String(128))  # registry name, checkpoint id or local name
    adapter_version: Mapped[int | None]  # registry versions only
    adapter_alias: Mapped[str | None] = mapped_column(String(64))  # the alias followed; None for name@N
    model: Mapped[str] = mapped_column(String(256))  # what the client asked for, e.g. "support-bot:prod"
    request_id: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(32))  # "chat.completions" | "completions"
    # The request's OpenAI `metadata` (at most 16 string pairs), kept for the tenant's own bookkeeping.
    request_metadata: Mapped[dict[str, Any] | None]
    # The defaults match what migration 0002 gave rows metered before it (outcome and time unknown).
    status: Mapped[UsageStatus] = mapped_column(enum_column(UsageStatus, "usage_status"), default=UsageStatus.ok)
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]
    cached_tokens: Mapped[int] = mapped_column(default=0)
    time_to_first_token_ms: Mapped[float | None] = mapped_column(Double)  # None: no token was generated
    duration_ms: Mapped[float] = mapped_column(Double, default=0.0)  # request received -> its end
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditLogEntry(Base):
    """One mutating API call: who did what to which resource, and whether it succeeded."""

    __tablename__ = "audit_log"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    tenant_id: Mapped[uuid.UUID | None]  # None: a server-wide action (e.g. creating a tenant)
    actor_key_id: Mapped[uuid.UUID | None]
    action: Mapped[str] = mapped_column(String(64))  # e.g. "adapter.create", "alias.move"
    resource_type: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(64))
    status_code: Mapped[int]
    client_ip: Mapped[str | None] = mapped_column(String(45))  # fits an IPv6 address
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
