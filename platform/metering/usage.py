"""Usage metering: one usage_records row per generation, written off the request path.

A route takes a `UsageMeter` (api/deps.py: ChatUsageMeterDep, CompletionUsageMeterDep) when the
request arrives; the generation stream reports its outputs to it and finishes it once, with the
outcome. The row goes to the app's usage BatchWriter, which inserts rows in batches.
`aggregate_usage` sums the rows for GET /v1/usage.
"""
from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine.adapters import AdapterHandle
from loraloom.engine.outputs import RequestOutput
from loraloom.platform.accounts.keys import Caller
from loraloom.platform.db.models import ApiKey, UsageRecord, UsageStatus, utcnow
from loraloom.platform.metering.batch_writer import BatchWriter

BASE_ADAPTER = "base"  # how the base model (no adapter) appears in aggregates


@dataclass
class UsageMeter:
    """Times one generation request and submits its usage row when it finishes.

    Created when the request arrives (so times include tokenizing); `begin` names the
    generation once it is known, `observe` sees each output, `finish` submits the row.
    """

    writer: BatchWriter[dict[str, Any]]
    caller: Caller
    endpoint: str  # "chat.completions" | "completions"
    received_s: float = field(default_factory=time.monotonic)
    request_id: str = ""
    model: str = ""  # what the client asked for
    adapter_key: str | None = None
    first_token_s: float | None = None
    last: RequestOutput | None = None
    finished: bool = False

    def begin(self, *, request_id: str, model: str, adapter: AdapterHandle | None) -> None:
        self.request_id = request_id
        self.model = model
        self.adapter_key = None if adapter is None else adapter.key

    def observe(self, output: RequestOutput) -> None:
        if self.first_token_s is None and output.token_ids:
            self.first_token_s = time.monotonic()
        self.last = output

    def outcome(self, *, failed: bool) -> UsageStatus:
        if failed:
            return UsageStatus.error
        if self.last is not None and self.last.finished and self.last.finish_reason != "abort":
            return UsageStatus.ok
        return UsageStatus.aborted  # the stream was closed (client left, shutdown) before the end

    def finish(self, *, failed: bool) -> None:
        """Submit the row; later calls do nothing (a stream may be closed more than once)."""
        if self.finished:
            return
        self.finished = True
        last = self.last
        self.writer.submit(
            {
                "tenant_id": self.caller.tenant_id,
                "api_key_id": self.caller.api_key_id,
                "adapter_version_id": None,  # the runtime key identifies the weights; see adapter_key
                "adapter_key": self.adapter_key,
                "model": self.model[:256],
                "request_id": self.request_id,
                "endpoint": self.endpoint,
                "status": self.outcome(failed=failed),
                "prompt_tokens": 0 if last is None else last.num_prompt_tokens,
                "completion_tokens": 0 if last is None else last.num_output_tokens,
                "cached_tokens": 0 if last is None else last.num_cached_tokens,
                "time_to_first_token_ms": (
                    None if self.first_token_s is None else (self.first_token_s - self.received_s) * 1000
                ),
                "duration_ms": (time.monotonic() - self.received_s) * 1000,
                "created_at": utcnow(),
            }
        )


def write_usage_records(session_factory: sessionmaker[Session], rows: Sequence[dict[str, Any]]) -> None:
    with session_factory.begin() as session:
        session.execute(insert(UsageRecord), list(rows))


class UsageGroup(str, enum.Enum):
    adapter = "adapter"
    key = "key"
    day = "day"


@dataclass
class UsageTotals:
    group: str  # the adapter key ("base" for none), the API key id, or the UTC day "YYYY-MM-DD"
    api_key_prefix: str | None  # when grouped by key
    requests: int
    errors: int
    aborted: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    mean_time_to_first_token_ms: float | None
    mean_duration_ms: float


def _utc_day(session: Session) -> ColumnElement[Any]:
    created_at = UsageRecord.created_at
    if session.get_bind().dialect.name == "postgresql":
        # A timestamptz's date depends on the session time zone: pin it to UTC.
        return func.to_char(func.timezone("UTC", created_at), "YYYY-MM-DD")
    return func.date(created_at)  # SQLite stores UTC text, whose date part is the UTC day


def aggregate_usage(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    group_by: UsageGroup,
    start: datetime | None,
    end: datetime | None,
) -> list[UsageTotals]:
    """Totals per group for one tenant over [start, end), ordered by group."""
    group_column = {
        UsageGroup.adapter: func.coalesce(UsageRecord.adapter_key, BASE_ADAPTER),
        UsageGroup.key: UsageRecord.api_key_id,
        UsageGroup.day: _utc_day(session),
    }[group_by]
    query = (
        select(
            group_column.label("group"),
            func.count().label("requests"),
            func.sum(case((UsageRecord.status == UsageStatus.error, 1), else_=0)).label("errors"),
            func.sum(case((UsageRecord.status == UsageStatus.aborted, 1), else_=0)).label("aborted"),
            func.sum(UsageRecord.prompt_tokens).label("prompt_tokens"),
            func.sum(UsageRecord.completion_tokens).label("completion_tokens"),
            func.sum(UsageRecord.cached_tokens).label("cached_tokens"),
            func.avg(UsageRecord.time_to_first_token_ms).label("ttft"),
            func.avg(UsageRecord.duration_ms).label("duration"),
        )
        .where(UsageRecord.tenant_id == tenant_id)
        .group_by(group_column)
        .order_by(group_column)
    )
    if start is not None:
        query = query.where(UsageRecord.created_at >= start)
    if end is not None:
        query = query.where(UsageRecord.created_at < end)
    rows = session.execute(query).all()
    prefixes: dict[uuid.UUID, str] = {}
    if group_by is UsageGroup.key:
        key_ids = [row.group for row in rows if row.group is not None]
        found = session.execute(select(ApiKey.id, ApiKey.prefix).where(ApiKey.id.in_(key_ids)))
        prefixes = {key_id: prefix for key_id, prefix in found}
    return [
        UsageTotals(
            group=str(row.group),
            api_key_prefix=prefixes.get(row.group),
            requests=row.requests,
            errors=int(row.errors),
            aborted=int(row.aborted),
            prompt_tokens=int(row.prompt_tokens),
            completion_tokens=int(row.completion_tokens),
            cached_tokens=int(row.cached_tokens),
            mean_time_to_first_token_ms=None if row.ttft is None else float(row.ttft),
            mean_duration_ms=float(row.duration),
        )
        for row in rows
    ]
