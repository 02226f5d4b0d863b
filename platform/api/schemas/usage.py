"""GET /v1/usage: metered tokens per adapter (by name, version, alias, or alias and version), API key or UTC day."""
from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from loraloom.platform.metering.usage import UsageGroup, UsageTotals


class UsageBucket(BaseModel):
    adapter: str | None = Field(
        default=None,
        description="group_by=adapter, version, alias or alias_version: the adapter's name (a fine-tuning "
        "checkpoint's id, a server-local adapter's name), `base` for the base model",
    )
    version: int | None = Field(
        default=None, description="group_by=version or alias_version: the registry version that served; null for "
        "the base model, checkpoints and server-local adapters"
    )
    alias: str | None = Field(
        default=None, description="group_by=alias or alias_version: the alias the requests followed (`latest` for "
        "a bare name); null for requests that named `name@N`, the base model or a non-registry adapter"
    )
    api_key_id: str | None = Field(default=None, description="group_by=key")
    api_key_prefix: str | None = None
    day: str | None = Field(default=None, description='group_by=day: "YYYY-MM-DD" in UTC')
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
    def of(cls, totals: UsageTotals) -> UsageBucket:
        return cls(**dataclasses.asdict(totals), total_tokens=totals.prompt_tokens + totals.completion_tokens)


class UsageReport(BaseModel):
    object: Literal["list"] = "list"
    tenant: str
    group_by: UsageGroup
    start: datetime | None
    end: datetime | None
    data: list[UsageBucket]
