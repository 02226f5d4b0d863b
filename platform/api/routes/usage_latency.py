"""Latency and errors from the metered requests: GET /v1/usage/latency (one adapter per hour or day)
and GET /v1/usage/top_adapters (the slowest or most failing adapters over a period).

A tenant sees its own requests only; the operator may ask for every tenant's top adapters."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from loraloom.platform.api.deps import DeveloperDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.api.routes.usage import as_utc
from loraloom.platform.api.routes.usage_series import MAX_BUCKETS, STEP
from loraloom.platform.api.schemas.common import IsoTime
from loraloom.platform.db.models import MAX_INT64
from loraloom.platform.metering.latency import LatencyStats, TopOrder, latency_series, top_adapters
from loraloom.platform.metering.usage_series import Granularity

router = APIRouter(tags=["usage"], responses=ERROR_RESPONSES)

MAX_TOP_PERIOD = timedelta(days=31)  # a top list scans every request of the period: keep it bounded
MAX_TOP_LIMIT = 50


class LatencyFigures(BaseModel):
    requests: int
    errors: int = Field(description="Requests the engine refused or failed (a client that left is not an error).")
    error_rate: float = Field(description="errors / requests.")
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    duration_p50_ms: float = Field(description="Request received to its end, median (nearest rank).")
    duration_p95_ms: float
    ttft_p50_ms: float | None = Field(description="Time to first token, median; null when no request produced a token.")
    ttft_p95_ms: float | None

    @classmethod
    def figures(cls, stats: LatencyStats) -> dict[str, object]:
        return {
            "requests": stats.requests, "errors": stats.errors, "error_rate": stats.errors / stats.requests,
            "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            "duration_p50_ms": stats.duration_ms[50], "duration_p95_ms": stats.duration_ms[95],
            "ttft_p50_ms": stats.ttft_ms[50], "ttft_p95_ms": stats.ttft_ms[95],
        }


class LatencyPointObject(LatencyFigures):
    start: datetime = Field(description="The bucket's first moment (UTC).")


class LatencySeries(BaseModel):
    object: Literal["list"] = "list"
    adapter: str
    version: int | None = Field(default=None, description="The version asked for; null: all the adapter's versions.")
    granularity: Granularity
    start: datetime
    end: datetime | None
    data: list[LatencyPointObject] = Field(description="Only buckets with requests, in time order.")


class AdapterLatencyObject(LatencyFigures):
    tenant: str = Field(description="The tenant's name (the caller's own unless the operator asked for all).")
    adapter: str = Field(description="The adapter's name (all its versions), a checkpoint id, or base.")


class TopAdapters(BaseModel):
    object: Literal["list"] = "list"
    order: TopOrder
    start: datetime
    end: datetime | None
    data: list[AdapterLatencyObject]


def _period(start: datetime | None, end: datetime | None) -> tuple[datetime, datetime | None]:
    start = as_utc(start) or datetime.now(timezone.utc) - timedelta(days=1)
    end = as_utc(end)
    if end is not None and end <= start:
        raise APIError(400, f"end: {end.isoformat()} is not after start {start.isoformat()}", param="end")
    return start, end


StartQuery = Annotated[IsoTime | None, Query(description="Inclusive; ISO 8601, UTC without an offset. Default: 24 h ago")]
EndQuery = Annotated[IsoTime | None, Query(description="Exclusive; ISO 8601, UTC without an offset. Default: now")]


@router.get("/v1/usage/latency", response_model=LatencySeries)
def get_latency_series(
    session: SessionDep,
    caller: DeveloperDep,
    adapter: Annotated[str, Query(min_length=1, description="One adapter's name (all its versions), a checkpoint id, or base")],
    granularity: Annotated[Granularity, Query(description="hour or day (UTC)")] = Granularity.hour,
    start: StartQuery = None,
    end: EndQuery = None,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT64, description="Only this version's requests (name@N), "
                                         "e.g. a canary's next to its stable's while an alias splits between them; "
                                         "default: all the adapter's versions")] = None,
) -> LatencySeries:
    start, end = _period(start, end)
    if (end or datetime.now(timezone.utc)) - start > STEP[granularity] * MAX_BUCKETS[granularity]:
        raise APIError(400, f"start: at most {MAX_BUCKETS[granularity]} {granularity.value} buckets per request; "
                            "narrow the range or use granularity=day", param="start")
    points = latency_series(session, tenant_id=caller.tenant_id, adapter=adapter, granularity=granularity,
                            start=start, end=end, version=version)
    return LatencySeries(
        adapter=adapter, version=version, granularity=granularity, start=start, end=end,
        data=[LatencyPointObject(start=point.start, **LatencyFigures.figures(point.stats)) for point in points],
    )


@router.get("/v1/usage/top_adapters", response_model=TopAdapters)
def get_top_adapters(
    session: SessionDep,
    caller: DeveloperDep,
    order: Annotated[TopOrder, Query(description="latency: slowest p95 first; errors: most errors first (only adapters with errors)")] = TopOrder.latency,
    start: StartQuery = None,
    end: EndQuery = None,
    limit: Annotated[int, Query(ge=1, le=MAX_TOP_LIMIT, description="How many adapters")] = 10,
    all_tenants: Annotated[bool, Query(description="Every tenant's adapters: the operator's key only")] = False,
) -> TopAdapters:
    start, end = _period(start, end)
    if (end or datetime.now(timezone.utc)) - start > MAX_TOP_PERIOD:
        raise APIError(400, f"start: a top list covers at most {MAX_TOP_PERIOD.days} days; start later", param="start")
    if all_tenants and not caller.operator:
        raise APIError(403, "all_tenants: only the operator's key sees every tenant's adapters; omit all_tenants "
                            "to see your own tenant's", param="all_tenants", code="operator_only")
    found = top_adapters(session, tenant_id=None if all_tenants else caller.tenant_id, order=order, start=start,
                         end=end, limit=limit)
    return TopAdapters(
        order=order, start=start, end=end,
        data=[AdapterLatencyObject(tenant=entry.tenant, adapter=entry.adapter, **LatencyFigures.figures(entry.stats))
              for entry in found],
    )
