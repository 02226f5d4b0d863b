"""GET /v1/usage: metered tokens of the caller's tenant, grouped by adapter, API key or UTC day."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from loraloom.platform.api.auth import tenant_in_scope
from loraloom.platform.api.deps import DeveloperDep, SessionDep, TenantQuery
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.metering.usage import UsageGroup, UsageTotals, aggregate_usage

router = APIRouter(tags=["usage"], responses=ERROR_RESPONSES)


class UsageBucket(BaseModel):
    adapter: str | None = None  # group_by=adapter: the runtime adapter key, "base" for no adapter
    api_key_id: str | None = None  # group_by=key
    api_key_prefix: str | None = None
    day: str | None = None  # group_by=day: "YYYY-MM-DD" in UTC
    requests: int
    errors: int
    aborted: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    mean_time_to_first_token_ms: float | None
    mean_duration_ms: float

    @classmethod
    def of(cls, group_by: UsageGroup, totals: UsageTotals) -> UsageBucket:
        group_field = {UsageGroup.adapter: "adapter", UsageGroup.key: "api_key_id", UsageGroup.day: "day"}[group_by]
        return cls(
            **{group_field: totals.group},
            api_key_prefix=totals.api_key_prefix,
            requests=totals.requests,
            errors=totals.errors,
            aborted=totals.aborted,
            prompt_tokens=totals.prompt_tokens,
            completion_tokens=totals.completion_tokens,
            total_tokens=totals.prompt_tokens + totals.completion_tokens,
            cached_tokens=totals.cached_tokens,
            mean_time_to_first_token_ms=totals.mean_time_to_first_token_ms,
            mean_duration_ms=totals.mean_duration_ms,
        )


class UsageReport(BaseModel):
    object: Literal["list"] = "list"
    tenant: str
    group_by: UsageGroup
    start: datetime | None
    end: datetime | None
    data: list[UsageBucket]


def as_utc(moment: datetime | None) -> datetime | None:
    """Query times without an offset are read as UTC (a bare date is its UTC midnight)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


@router.get("/v1/usage", response_model=UsageReport)
def get_usage(
    session: SessionDep,
    caller: DeveloperDep,
    group_by: Annotated[UsageGroup, Query(description="adapter, key or day (UTC)")] = UsageGroup.day,
    start: Annotated[datetime | None, Query(description="Inclusive; ISO 8601, UTC when no offset is given")] = None,
    end: Annotated[datetime | None, Query(description="Exclusive; ISO 8601, UTC when no offset is given")] = None,
    tenant: TenantQuery = None,
) -> UsageReport:
    start, end = as_utc(start), as_utc(end)
    if start is not None and end is not None and end <= start:
        raise APIError(400, f"end: {end.isoformat()} is not after start {start.isoformat()}", param="end")
    scope = tenant_in_scope(session, caller, tenant)
    totals = aggregate_usage(session, tenant_id=scope.id, group_by=group_by, start=start, end=end)
    return UsageReport(
        tenant=scope.name,
        group_by=group_by,
        start=start,
        end=end,
        data=[UsageBucket.of(group_by, entry) for entry in totals],
    )
