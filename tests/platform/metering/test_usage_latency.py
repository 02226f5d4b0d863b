"""latency_series and top_adapters on SQLite and PostgreSQL: percentiles, errors and tokens of the
usage rows, compared with nearest-rank percentiles computed here in Python from the same rows; one
tenant's rows never in another's answer."""
from __future__ import annotations

import math
import random
import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from loraloom.platform.db.models import Tenant, UsageStatus
from loraloom.platform.metering.latency import TopOrder, latency_series, top_adapters
from loraloom.platform.metering.usage import write_usage_records
from loraloom.platform.metering.usage_series import Granularity

HOURS = [datetime(2026, 11, 20, hour, tzinfo=timezone.utc) for hour in (9, 10, 13)]
START = datetime(2026, 11, 20, tzinfo=timezone.utc)


def nearest_rank(values: list[float], percent: int) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[math.ceil(len(ordered) * percent / 100) - 1]


def make_rows(tenant_id: uuid.UUID, adapters: list[str | None], count: int, seed: int, slow: float = 1.0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        status = rng.choice([UsageStatus.ok, UsageStatus.ok, UsageStatus.error, UsageStatus.aborted])
        rows.append({
            "tenant_id": tenant_id, "api_key_id": None, "adapter_version_id": None, "adapter_key": None,
            "adapter_name": rng.choice(adapters), "adapter_version": None, "adapter_alias": None,
            "model": "m", "request_id": f"req-{seed}-{index}", "endpoint": "chat.completions", "status": status,
            "prompt_tokens": rng.randint(1, 300), "completion_tokens": rng.randint(0, 100), "cached_tokens": 0,
            # Errors produced no token; rounded values make ties, which nearest rank must handle.
            "time_to_first_token_ms": None if status is UsageStatus.error else float(rng.randint(5, 60)) * slow,
            "duration_ms": float(rng.randint(50, 900)) * slow,
            "created_at": rng.choice(HOURS) + timedelta(minutes=rng.randint(0, 59)),
        })
    return rows


@pytest.fixture
def tenants(session_factory):
    with session_factory.begin() as session:
        rows = [Tenant(name="acme"), Tenant(name="umbrella")]
        session.add_all(rows)
        session.flush()
        return rows[0].id, rows[1].id


def test_latency_series_gives_each_hour_s_percentiles_errors_and_tokens(session_factory, tenants):
    acme, umbrella = tenants
    rows = make_rows(acme, ["support", "other", None], 150, seed=1)
    write_usage_records(session_factory, rows)
    # Another tenant's "support" is ten times slower: had it leaked in, the percentiles would show it.
    write_usage_records(session_factory, make_rows(umbrella, ["support"], 40, seed=2, slow=10.0))

    with session_factory() as session:
        points = latency_series(session, tenant_id=acme, adapter="support", granularity=Granularity.hour,
                                start=START, end=None)
    mine = [row for row in rows if row["adapter_name"] == "support"]
    by_hour: dict[datetime, list[dict]] = defaultdict(list)
    for row in mine:
        by_hour[row["created_at"].replace(minute=0)].append(row)
    assert [point.start for point in points] == sorted(by_hour)
    for point in points:
        group = by_hour[point.start]
        durations = [row["duration_ms"] for row in group]
        ttfts = [row["time_to_first_token_ms"] for row in group if row["time_to_first_token_ms"] is not None]
        assert point.stats.requests == len(group)
        assert point.stats.errors == sum(row["status"] is UsageStatus.error for row in group)
        assert point.stats.prompt_tokens == sum(row["prompt_tokens"] for row in group)
        assert point.stats.completion_tokens == sum(row["completion_tokens"] for row in group)
        for percent in (50, 95):
            assert point.stats.duration_ms[percent] == nearest_rank(durations, percent), (point.start, percent)
            assert point.stats.ttft_ms[percent] == nearest_rank(ttfts, percent), (point.start, percent)

    with session_factory() as session:
        base = latency_series(session, tenant_id=acme, adapter="base", granularity=Granularity.day, start=START, end=None)
        assert sum(point.stats.requests for point in base) == sum(row["adapter_name"] is None for row in rows)
        later = latency_series(session, tenant_id=acme, adapter="support", granularity=Granularity.hour,
                               start=HOURS[-1], end=None)
        assert [point.start for point in later] == [HOURS[-1]]  # the window's start is honoured


def test_a_bucket_whose_requests_all_failed_has_no_first_token_percentile(session_factory, tenants):
    acme, _ = tenants
    rows = make_rows(acme, ["broken"], 6, seed=3)
    for row in rows:
        row.update(status=UsageStatus.error, time_to_first_token_ms=None, created_at=HOURS[0])
    write_usage_records(session_factory, rows)
    with session_factory() as session:
        [point] = latency_series(session, tenant_id=acme, adapter="broken", granularity=Granularity.hour,
                                 start=START, end=None)
    assert point.stats.errors == 6 and point.stats.ttft_ms == {50: None, 95: None}
    assert point.stats.duration_ms[95] == nearest_rank([row["duration_ms"] for row in rows], 95)


def test_top_adapters_rank_by_p95_or_errors_within_the_tenant_unless_all_are_asked(session_factory, tenants):
    acme, umbrella = tenants
    acme_rows = make_rows(acme, ["fast", "mid", None], 120, seed=4)
    slow_rows = make_rows(acme, ["slow"], 30, seed=5, slow=5.0)
    theirs = make_rows(umbrella, ["slowest"], 20, seed=6, slow=50.0)
    write_usage_records(session_factory, acme_rows + slow_rows + theirs)
    every = acme_rows + slow_rows

    def p95(name: str | None, rows: list[dict]) -> float:
        return nearest_rank([row["duration_ms"] for row in rows if row["adapter_name"] == name], 95)

    with session_factory() as session:
        by_latency = top_adapters(session, tenant_id=acme, order=TopOrder.latency, start=START, end=None, limit=10)
        by_errors = top_adapters(session, tenant_id=acme, order=TopOrder.errors, start=START, end=None, limit=2)
        everyone = top_adapters(session, tenant_id=None, order=TopOrder.latency, start=START, end=None, limit=1)
    names = {"fast": "fast", "mid": "mid", "base": None, "slow": "slow"}
    assert {entry.tenant for entry in by_latency} == {"acme"}
    assert [entry.adapter for entry in by_latency] == sorted(names, key=lambda name: -p95(names[name], every))
    assert by_latency[0].adapter == "slow"
    for entry in by_latency:
        assert entry.stats.duration_ms[95] == p95(names[entry.adapter], every)

    errors = defaultdict(int)
    for row in every:
        errors[row["adapter_name"] or "base"] += row["status"] is UsageStatus.error
    assert len(by_errors) == 2
    assert [entry.stats.errors for entry in by_errors] == sorted(errors.values(), reverse=True)[:2]

    # The operator's view: another tenant's adapter, named with its tenant.
    assert [(entry.tenant, entry.adapter) for entry in everyone] == [("umbrella", "slowest")]
