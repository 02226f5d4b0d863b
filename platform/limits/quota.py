"""The monthly token quota: a tenant's input plus output tokens in the current UTC month.

The usage table is the ledger; summing it on every request would cost a query each, so the sum
lives in a limiter counter per tenant and month, seeded from the table on first use and then
moved by each request's actual tokens as it ends. Rows still in the usage writer's batch when a
counter is seeded (about a second of traffic) are missed by it: the quota is exact to that.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import UsageRecord

# A counter outlives its month by this much, then expires: nothing reads it after the month ends.
COUNTER_GRACE = timedelta(days=2)


def month_start(now: datetime) -> datetime:
    return now.astimezone(timezone.utc).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month_start(now: datetime) -> datetime:
    start = month_start(now)
    return (start + timedelta(days=32)).replace(day=1)


def quota_counter_key(tenant_id: uuid.UUID, now: datetime) -> str:
    return f"quota:{tenant_id}:{month_start(now):%Y-%m}"


def counter_ttl_s(now: datetime) -> float:
    return (next_month_start(now) + COUNTER_GRACE - now).total_seconds()


def month_usage(session: Session, tenant_id: uuid.UUID, now: datetime) -> int:
    """The tenant's metered tokens (prompt + completion) since the start of `now`'s UTC month."""
    total = session.scalar(
        select(func.coalesce(func.sum(UsageRecord.prompt_tokens + UsageRecord.completion_tokens), 0))
        .where(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= month_start(now))
    )
    return int(total or 0)
