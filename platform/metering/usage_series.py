"""Metered requests and tokens per adapter in hour or day buckets (UTC), for charts.

Grouped in SQL by bucket and adapter *name* (the name the usage row recorded): a name's versions
are one line on a chart.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import UsageRecord
from loraloom.platform.metering.usage import BASE_ADAPTER


class Granularity(str, enum.Enum):
    hour = "hour"
    day = "day"


@dataclass
class SeriesPoint:
    start: datetime  # the bucket's first moment, UTC
    adapter: str  # the adapter's name, a checkpoint id, or "base"
    requests: int
    prompt_tokens: int
    completion_tokens: int


_SQLITE_FORMATS = {Granularity.hour: "%Y-%m-%d %H:00:00", Granularity.day: "%Y-%m-%d 00:00:00"}
_POSTGRES_FORMATS = {Granularity.hour: "YYYY-MM-DD HH24:00:00", Granularity.day: "YYYY-MM-DD 00:00:00"}


def bucket_start(session: Session, granularity: Granularity) -> ColumnElement[Any]:
    created_at = UsageRecord.created_at
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", created_at), _POSTGRES_FORMATS[granularity])
    return func.strftime(_SQLITE_FORMATS[granularity], created_at)  # SQLite stores UTC text


def usage_series(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    granularity: Granularity,
    start: datetime,
    end: datetime | None,
    adapter: str | None,
) -> list[SeriesPoint]:
    """Buckets with at least one request in [start, end), ordered by time then adapter name."""
    bucket = bucket_start(session, granularity).label("bucket")
    name = func.coalesce(UsageRecord.adapter_name, BASE_ADAPTER).label("adapter")
    query = (
        select(
            bucket,
            name,
            func.count().label("requests"),
            func.sum(UsageRecord.prompt_tokens).label("prompt_tokens"),
            func.sum(UsageRecord.completion_tokens).label("completion_tokens"),
        )
        .where(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= start)
        .group_by(bucket, name)
    )
    if end is not None:
        query = query.where(UsageRecord.created_at < end)
    if adapter is not None:
        query = query.where(name == adapter)
    points = {
        (row.bucket, row.adapter): SeriesPoint(
            datetime.fromisoformat(row.bucket).replace(tzinfo=timezone.utc), row.adapter, row.requests,
            int(row.prompt_tokens), int(row.completion_tokens),
        )
        for row in session.execute(query)
    }
    return [points[key] for key in sorted(points)]
