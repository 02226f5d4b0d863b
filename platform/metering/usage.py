"""Usage metering: one usage_records row per generation, written off the request path.

A route takes a `UsageMeter` (api/deps.py: ChatUsageMeterDep, CompletionUsageMeterDep) when the
request arrives; the generation stream reports its outputs to it and finishes it once, with the
outcome. The row goes to the app's usage BatchWriter, which inserts rows in batches.
`aggregate_usage` sums the rows for GET /v1/usage, by the names users know (adapter, version,
alias), by API key or by UTC day; never by the engine's runtime key, which names content.
"""
from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement, case, func, insert, nulls_first, select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine import AdapterHandle, RequestOutput
from loraloom.platform.accounts.keys import Caller
from loraloom.platform.db.models import ApiKey, UsageRecord, UsageStatus, utcnow
from loraloom.platform.metering.batch_writer import BatchWriter

BASE_ADAPTER = "base"  # how the base model (no adapter) appears in aggregates


class MeteredAdapter(Protocol):
    """What a usage row records of the adapter a request ran (registry.named.NamedAdapter is one)."""

    @property
    def handle(self) -> AdapterHandle: ...
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int | None: ...
    @property
    def alias(self) -> str | None: ...
    @property
    def version_id(self) -> uuid.UUID | None: ...


@dataclass
class UsageMeter:
    """Times one generation request and submits its usage row when it finishes.

    Created when the request arrives (so times include tokenizing); `begin` names the
    generation once it is known, `observe` sees each output, `finish` submits the row.
    A request for n choices runs n engine requests over one prompt: one row, whose prompt
    (and cached) tokens are the first choice's, counted once, and whose completion tokens are
    the sum over the choices.
    """

    writer: BatchWriter[dict[str, Any]]
    caller: Caller
    endpoint: str  # "chat.completions" | "completions"
    received_s: float = field(default_factory=time.monotonic)
    request_id: str = ""
    model: str = ""  # what the client asked for
    adapter_reference: str = ""  # the adapter as the request named it (`adapter_id`, else `model`)
    adapter: MeteredAdapter | None = None
    request_metadata: dict[str, str] | None = None  # the request's OpenAI `metadata`, stored with its row
    first_token_s: float | None = None
    num_choices: int = 1
    lasts: dict[str, RequestOutput] = field(default_factory=dict)  # engine request id -> its latest output
    finished: bool = False
    status: UsageStatus | None = None  # the outcome `finish` recorded
    # Called with the meter once it has finished (the rate limits true up their charge): they must not block.
    on_finish: list[Callable[[UsageMeter], None]] = field(default_factory=list)

    def begin(self, *, request_id: str, model: str, adapter: MeteredAdapter | None, num_choices: int = 1) -> None:
        self.request_id = request_id
        self.model = model
        self.adapter = adapter
        self.num_choices = num_choices

    def observe(self, output: RequestOutput) -> None:
        if self.first_token_s is None and output.token_ids:
            self.first_token_s = time.monotonic()
        self.lasts[output.request_id] = output

    def outcome(self, *, failed: bool) -> UsageStatus:
        if failed:
            return UsageStatus.error
        if len(self.lasts) == self.num_choices and all(
            last.finished and last.finish_reason != "abort" for last in self.lasts.values()
        ):
            return UsageStatus.ok
        return UsageStatus.aborted  # the stream was closed (client left, shutdown) before the end

    def token_counts(self) -> dict[str, Any]:
        """prompt_tokens, completion_tokens, cached_tokens and time_to_first_token_ms (None before one)."""
        first = next(iter(self.lasts.values()), None)  # the first choice observed: outputs come in choice order
        return {
            "prompt_tokens": 0 if first is None else first.num_prompt_tokens,
            "completion_tokens": sum(last.num_output_tokens for last in self.lasts.values()),
            "cached_tokens": 0 if first is None else first.num_cached_tokens,
            "time_to_first_token_ms": (
                None if self.first_token_s is None else (self.first_token_s - self.received_s) * 1000
            ),
        }

    def log_fields(self) -> dict[str, Any]:
        """What the request's log line (api/request_log.py) says of the generation, however far it got."""
        return {"adapter": self.adapter_reference or None,
                # What served it: `name@N` for a registry version (the reference may be `name:prod`).
                "adapter_resolved": None if self.adapter is None else self.adapter.handle.name,
                "completion_id": self.request_id or None,
                # A stream's HTTP status is 200 from its first byte: this says how the generation ended.
                "outcome": None if self.status is None else self.status.value,
                **self.token_counts()}

    def finish(self, *, failed: bool) -> None:
        """Submit the row; later calls do nothing (a stream may be closed more than once)."""
        if self.finished:
            return
        self.finished = True
        self.status = self.outcome(failed=failed)
        adapter = self.adapter
        self.writer.submit(
            {
                "tenant_id": self.caller.tenant_id,
                "api_key_id": self.caller.api_key_id,
                "adapter_version_id": None if adapter is None else adapter.version_id,
                "adapter_key": None if adapter is None else adapter.handle.key,
                "adapter_name": None if adapter is None else adapter.name,
                "adapter_version": None if adapter is None else adapter.version,
                "adapter_alias": None if adapter is None else adapter.alias,
                "model": self.model[:256],
                "request_id": self.request_id,
                "endpoint": self.endpoint,
                "request_metadata": self.request_metadata,
                "status": self.status,
                **self.token_counts(),
                "duration_ms": (time.monotonic() - self.received_s) * 1000,
                "created_at": utcnow(),
            }
        )
        for hook in self.on_finish:
            hook(self)


def write_usage_records(session_factory: sessionmaker[Session], rows: Sequence[dict[str, Any]]) -> None:
    with session_factory.begin() as session:
        session.execute(insert(UsageRecord), list(rows))


class UsageGroup(str, enum.Enum):
    adapter = "adapter"  # the adapter's name ("base" for none)
    version = "version"  # adapter name and version number
    alias = "alias"  # adapter name and the alias the requests followed (none for name@N)
    # adapter name, alias and the version that served: a split alias's versions apart (canary and stable)
    alias_version = "alias_version"
    key = "key"
    day = "day"


@dataclass
class UsageTotals:
    """One group's sums; the fields of the grouping are set, the others None."""

    requests: int
    errors: int
    aborted: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    mean_time_to_first_token_ms: float | None
    mean_duration_ms: float
    adapter: str | None = None  # by adapter, version or alias: the name, "base" for the base model
    version: int | None = None  # by version (or alias_version): None for the base, checkpoints, server-local adapters
    alias: str | None = None  # by alias (or alias_version): None for requests that named no alias
    api_key_id: str | None = None  # by key
    api_key_prefix: str | None = None
    day: str | None = None  # by day: "YYYY-MM-DD" in UTC


def _group_columns(session: Session, group_by: UsageGroup) -> dict[str, ColumnElement[Any]]:
    """UsageTotals field -> the column it is grouped and ordered by."""
    adapter = func.coalesce(UsageRecord.adapter_name, BASE_ADAPTER)
    return {
        UsageGroup.adapter: {"adapter": adapter},
        UsageGroup.version: {"adapter": adapter, "version": UsageRecord.adapter_version},
        UsageGroup.alias: {"adapter": adapter, "alias": UsageRecord.adapter_alias},
        UsageGroup.alias_version: {"adapter": adapter, "alias": UsageRecord.adapter_alias,
                                   "version": UsageRecord.adapter_version},
        UsageGroup.key: {"api_key_id": UsageRecord.api_key_id},
        UsageGroup.day: {"day": _utc_day(session)},
    }[group_by]


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
    columns = _group_columns(session, group_by)
    query = (
        select(
            *(column.label(field) for field, column in columns.items()),
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
        .group_by(*columns.values())
        .order_by(*(nulls_first(column) for column in columns.values()))
    )
    if start is not None:
        query = query.where(UsageRecord.created_at >= start)
    if end is not None:
        query = query.where(UsageRecord.created_at < end)
    rows = session.execute(query).all()
    prefixes: dict[uuid.UUID, str] = {}
    if group_by is UsageGroup.key:
        key_ids = [row.api_key_id for row in rows if row.api_key_id is not None]
        found = session.execute(select(ApiKey.id, ApiKey.prefix).where(ApiKey.id.in_(key_ids)))
        prefixes = {key_id: prefix for key_id, prefix in found}
    totals = []
    for row in rows:
        group = {field: getattr(row, field) for field in columns}
        if group_by is UsageGroup.key:
            group = {"api_key_id": None if row.api_key_id is None else str(row.api_key_id),
                     "api_key_prefix": prefixes.get(row.api_key_id)}
        totals.append(UsageTotals(
            requests=row.requests,
            errors=int(row.errors),
            aborted=int(row.aborted),
            prompt_tokens=int(row.prompt_tokens),
            completion_tokens=int(row.completion_tokens),
            cached_tokens=int(row.cached_tokens),
            mean_time_to_first_token_ms=None if row.ttft is None else float(row.ttft),
            mean_duration_ms=float(row.duration),
            **group,
        ))
    return totals
