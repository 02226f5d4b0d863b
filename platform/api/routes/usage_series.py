"""GET /v1/usage/series: requests and tokens per adapter per hour or day (UTC), the caller's tenant only."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from loraloom.platform.api.deps import DeveloperDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.api.routes.usage import as_utc
from loraloom.platform.api.schemas.common import IsoTime
from loraloom.platform.metering.usage_series import Granularity, usage_series

router = APIRouter(tags=["usage"], responses=ERROR_RESPONSES)

# Enough for a chart, small enough that a wide range cannot make a huge response.
MAX_BUCKETS = {Granularity.hour: 24 * 31, Granularity.day: 366}
STEP = {Granularity.hour: timedelta(hours=1), Granularity.day: timedelta(days=1)}


class SeriesPointObject(BaseModel):
    start: datetime = Field(description="The bucket's first moment (UTC).")
    adapter: str = Field(description="The adapter's name (all its versions), a checkpoint id, or base.")
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageSeries(BaseModel):
    object: Literal["list"] = "list"
    granularity: Granularity
    start: datetime
    end: datetime | None
    data: list[SeriesPointObject] = Field(description="Only buckets with requests; ordered by time, then adapter.")


@router.get("/v1/usage/series", response_model=UsageSeries)
def get_usage_series(
    session: SessionDep,
    caller: DeveloperDep,
    granularity: Annotated[Granularity, Query(description="hour or day (UTC)")] = Granularity.hour,
    start: Annotated[IsoTime | None, Query(description="Inclusive; ISO 8601, UTC without an offset. Default: 24 h ago")] = None,
    end: Annotated[IsoTime | None, Query(description="Exclusive; ISO 8601, UTC without an offset. Default: now")] = None,
    adapter: Annotated[str | None, Query(description="One adapter's name (or a checkpoint id, or base); default: all")] = None,
) -> UsageSeries:
    start = as_utc(start) or datetime.now(timezone.utc) - timedelta(days=1)
    end = as_utc(end)
    if end is not None and end <= start:
        raise APIError(400, f"end: {end.isoformat()} is not after start {start.isoformat()}", param="end")
    span = (end or datetime.now(timezone.utc)) - start
    if span > STEP[granularity] * MAX_BUCKETS[granularity]:
        raise APIError(400, f"start: at most {MAX_BUCKETS[granularity]} {granularity.value} buckets per request; "
                            "narrow the range or use granularity=day", param="start")
    points = usage_series(session, tenant_id=caller.tenant_id, granularity=granularity, start=start, end=end,
                          adapter=adapter)
    return UsageSeries(
        granularity=granularity, start=start, end=end,
        data=[SeriesPointObject(start=p.start, adapter=p.adapter, requests=p.requests, prompt_tokens=p.prompt_tokens,
                                completion_tokens=p.completion_tokens,
                                total_tokens=p.prompt_tokens + p.completion_tokens) for p in points],
    )
