"""GET /v1/usage: metered tokens per adapter, API key or UTC day."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from loraloom.platform.metering.usage import UsageGroup, UsageTotals


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
