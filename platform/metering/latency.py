"""Latency, errors and tokens of metered requests, grouped: per time bucket for one adapter (the
adapter page's charts), or per adapter over a period (the server page's top lists).

Percentiles are nearest-rank (the smallest value with at least p% of the group at or below it) and
are computed in SQL with window functions, the same statement on SQLite and PostgreSQL, so the rows
never travel to Python. Time to first token leaves out requests that produced no token.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import Tenant, UsageRecord, UsageStatus
from loraloom.platform.metering.usage import BASE_ADAPTER
from loraloom.platform.metering.usage_series import Granularity, bucket_start

PERCENTILES = (50, 95)


@dataclass
class LatencyStats:
    requests: int
    errors: int  # status "error": the engine refused or failed the request (a client leaving is not one)
    prompt_tokens: int
    completion_tokens: int
    duration_ms: dict[int, float]  # percentile -> request received to its end
    ttft_ms: dict[int, float | None]  # percentile -> time to first token; None when no request produced one


@dataclass
class LatencyPoint:
    start: datetime  # the bucket's first moment, UTC
    stats: LatencyStats


@dataclass
class AdapterLatency:
    tenant_id: uuid.UUID
    tenant: str
    adapter: str
    stats: LatencyStats


class TopOrder(str, enum.Enum):
    latency = "latency"  # slowest p95 end-to-end first
    errors = "errors"  # most failed requests first


def adapter_name() -> ColumnElement[Any]:
    return func.coalesce(UsageRecord.adapter_name, BASE_ADAPTER)


def _grouped_stats(groups: list[ColumnElement[Any]], where: list[ColumnElement[bool]]) -> tuple[Select[Any], Any]:
    """One row per group: counts, token sums and percentiles; and the ranked subquery its columns come from."""
    duration, ttft = UsageRecord.duration_ms, UsageRecord.time_to_first_token_ms
    labelled = [group.label(f"group_{index}") for index, group in enumerate(groups)]
    ranked = (
        select(
            *labelled,
            duration.label("duration"),
            ttft.label("ttft"),
            UsageRecord.status.label("status"),
            UsageRecord.prompt_tokens.label("prompt_tokens"),
            UsageRecord.completion_tokens.label("completion_tokens"),
            func.row_number().over(partition_by=groups, order_by=duration).label("duration_rank"),
            func.count().over(partition_by=groups).label("count"),
            # Ranked among the requests that have a first token only: their own partition.
            func.row_number().over(partition_by=[*groups, ttft.is_(None)], order_by=ttft).label("ttft_rank"),
            func.count(ttft).over(partition_by=groups).label("ttft_count"),
        )
        .where(*where)
        .subquery()
    )

    def at_percentile(value: Any, rank: Any, count: Any, percent: int) -> ColumnElement[Any]:
        # Nearest rank: the least rank r with r / count >= percent / 100; values rise with rank, so MIN finds it.
        return func.min(case((rank * 100 >= count * percent, value)))

    columns = [
        func.count().label("requests"),
        error_count(ranked).label("errors"),
        func.sum(ranked.c.prompt_tokens).label("prompt_tokens"),
        func.sum(ranked.c.completion_tokens).label("completion_tokens"),
    ]
    for percent in PERCENTILES:
        columns.append(at_percentile(ranked.c.duration, ranked.c.duration_rank, ranked.c.count, percent)
                       .label(f"duration_p{percent}"))
        columns.append(at_percentile(ranked.c.ttft, ranked.c.ttft_rank, ranked.c.ttft_count, percent)
                       .label(f"ttft_p{percent}"))
    keys = [ranked.c[group.name] for group in labelled]
    return select(*keys, *columns).group_by(*keys), ranked


def error_count(ranked: Any) -> ColumnElement[Any]:
    return func.sum(case((ranked.c.status == UsageStatus.error, 1), else_=0))


def _stats(row: Any) -> LatencyStats:
    return LatencyStats(
        requests=row.requests, errors=int(row.errors), prompt_tokens=int(row.prompt_tokens),
        completion_tokens=int(row.completion_tokens),
        duration_ms={percent: float(getattr(row, f"duration_p{percent}")) for percent in PERCENTILES},
        ttft_ms={percent: _optional_float(getattr(row, f"ttft_p{percent}")) for percent in PERCENTILES},
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _period(start: datetime, end: datetime | None) -> list[ColumnElement[bool]]:
    where = [UsageRecord.created_at >= start]
    if end is not None:
        where.append(UsageRecord.created_at < end)
    return where


def latency_series(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    adapter: str,
    granularity: Granularity,
    start: datetime,
    end: datetime | None,
    version: int | None = None,
) -> list[LatencyPoint]:
    """One adapter's buckets with at least one request in [start, end), in time order: of all its versions,
    or of `version` alone (a canary's next to its stable's, while an alias splits between them)."""
    bucket = bucket_start(session, granularity)
    where = [UsageRecord.tenant_id == tenant_id, adapter_name() == adapter, *_period(start, end)]
    if version is not None:
        where.append(UsageRecord.adapter_version == version)
    query, ranked = _grouped_stats([bucket], where)
    points = [
        LatencyPoint(datetime.fromisoformat(row.group_0).replace(tzinfo=timezone.utc), _stats(row))
        for row in session.execute(query)
    ]
    return sorted(points, key=lambda point: point.start)


def top_adapters(
    session: Session,
    *,
    tenant_id: uuid.UUID | None,
    order: TopOrder,
    start: datetime,
    end: datetime | None,
    limit: int,
) -> list[AdapterLatency]:
    """The `limit` adapters of a tenant (None: of every tenant, the operator's view) that were slowest
    (p95 end-to-end) or failed most in [start, end); ties go to the busier adapter, then by name."""
    where = _period(start, end)
    if tenant_id is not None:
        where.append(UsageRecord.tenant_id == tenant_id)
    query, ranked = _grouped_stats([UsageRecord.tenant_id, adapter_name()], where)
    first = query.selected_columns.duration_p95 if order is TopOrder.latency else query.selected_columns.errors
    if order is TopOrder.errors:
        query = query.having(error_count(ranked) > 0)  # PostgreSQL's HAVING cannot name the output column
    query = query.order_by(first.desc(), func.count().desc(), ranked.c.group_1).limit(limit)
    rows = session.execute(query).all()
    names = dict(session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_({row.group_0 for row in rows}))).all())
    return [
        AdapterLatency(tenant_id=row.group_0, tenant=names.get(row.group_0, str(row.group_0)), adapter=row.group_1,
                       stats=_stats(row))
        for row in rows
    ]
