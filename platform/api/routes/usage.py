"""GET /v1/usage: metered tokens of the caller's tenant, grouped by adapter (name, version, alias or both),
API key or UTC day. Adapters appear under the names users know, never the engine's runtime key."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Query

from loraloom.platform.api.auth import tenant_in_scope
from loraloom.platform.api.deps import DeveloperDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.api.schemas.common import IsoTime, TenantQuery
from loraloom.platform.api.schemas.usage import UsageBucket, UsageReport
from loraloom.platform.metering.usage import UsageGroup, aggregate_usage

router = APIRouter(tags=["usage"], responses=ERROR_RESPONSES)


def as_utc(moment: datetime | None) -> datetime | None:
    """Query times without an offset are read as UTC (a bare date is its UTC midnight)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


@router.get("/v1/usage", response_model=UsageReport)
def get_usage(
    session: SessionDep,
    caller: DeveloperDep,
    group_by: Annotated[UsageGroup, Query(
        description="`adapter` (by name), `version` (name and version number), `alias` (name and the alias the "
        "requests followed), `alias_version` (name, alias and the version that served: an alias split between "
        "versions shows each apart), `key` (API key) or `day` (UTC)"
    )] = UsageGroup.day,
    start: Annotated[IsoTime | None, Query(description="Inclusive; ISO 8601, UTC when no offset is given")] = None,
    end: Annotated[IsoTime | None, Query(description="Exclusive; ISO 8601, UTC when no offset is given")] = None,
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
        data=[UsageBucket.of(entry) for entry in totals],
    )
