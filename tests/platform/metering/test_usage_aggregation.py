"""aggregate_usage on SQLite and PostgreSQL: rows written by the usage writer's `write`,
summed per adapter name, version, alias, key and UTC day, per tenant, within [start, end);
compared with sums computed here in Python from the same rows."""
from __future__ import annotations

import random
import uuid
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from loraloom.platform.db.api_keys import create_api_key
from loraloom.platform.db.models import ApiKeyRole, Tenant, UsageRecord, UsageStatus
from loraloom.platform.metering.usage import BASE_ADAPTER, UsageGroup, aggregate_usage, write_usage_records

# Late in the UTC day: in any other time zone some of these fall on another local date.
DAYS = [datetime(2026, 11, day, 23, 30, tzinfo=timezone.utc) for day in (20, 21, 22)]
SHARED_CONTENT = "acme-id/" + "f" * 32  # support@3 and other@1 hold the same bytes: one runtime key
# (runtime key, name, version, alias followed) as the meter writes them; None everywhere: the base model.
ADAPTERS = [
    (None, None, None, None),
    ("server/" + "a" * 32, "alpha", None, None),  # a server-local adapter
    (SHARED_CONTENT, "support", 3, "prod"),
    (SHARED_CONTENT, "support", 3, "latest"),
    ("acme-id/" + "b" * 32, "support", 2, None),  # named as support@2
    (SHARED_CONTENT, "other", 1, "latest"),
]


@pytest.fixture
def db(session_factory):
    return session_factory


def make_rows(tenant_id: uuid.UUID, key_ids: list[uuid.UUID], count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        status = rng.choice(list(UsageStatus))
        ttft = None if status is UsageStatus.error else rng.uniform(1, 50)
        rows.append(
            {
                "tenant_id": tenant_id,
                "api_key_id": rng.choice(key_ids),
                "adapter_version_id": None,
                **dict(zip(("adapter_key", "adapter_name", "adapter_version", "adapter_alias"), rng.choice(ADAPTERS))),
                "model": "m",
                "request_id": f"req-{seed}-{index}",
                "endpoint": "completions",
                "status": status,
                "prompt_tokens": rng.randint(1, 500),
                "completion_tokens": 0 if status is UsageStatus.error else rng.randint(1, 200),
                "cached_tokens": rng.randint(0, 16),
                "time_to_first_token_ms": ttft,
                "duration_ms": rng.uniform(50, 500),
                "created_at": rng.choice(DAYS) + timedelta(minutes=rng.randint(0, 29)),
            }
        )
    return rows


def expected(rows: list[dict], group_of) -> dict[tuple, dict]:
    groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    ttfts: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        total = groups[group_of(row)]
        total["requests"] += 1
        total["errors"] += row["status"] is UsageStatus.error
        total["aborted"] += row["status"] is UsageStatus.aborted
        for field in ("prompt_tokens", "completion_tokens", "cached_tokens", "duration_ms"):
            total[field] += row[field]
        if row["time_to_first_token_ms"] is not None:
            ttfts[group_of(row)].append(row["time_to_first_token_ms"])
    for group, total in groups.items():
        total["duration_ms"] /= total["requests"]
        total["ttft"] = sum(ttfts[group]) / len(ttfts[group]) if ttfts[group] else None
    return groups


def by_group(values: tuple) -> tuple:
    """The order aggregate_usage returns groups in: by each field, None first."""
    return tuple((value is not None, value) for value in values)


def test_usage_is_aggregated_by_adapter_names_key_and_day(db):
    with db.begin() as session:
        tenants = [Tenant(name="acme"), Tenant(name="umbrella")]
        session.add_all(tenants)
        session.flush()
        keys = [create_api_key(session, tenant_id=tenants[0].id, name=f"k{i}", role=ApiKeyRole.inference)[0]
                for i in range(3)]
        other_key, _ = create_api_key(session, tenant_id=tenants[1].id, name="other", role=ApiKeyRole.inference)
        session.flush()
        key_ids, prefixes = [key.id for key in keys], {str(key.id): key.prefix for key in keys}
        acme, umbrella, other_key_id = tenants[0].id, tenants[1].id, other_key.id
    rows = make_rows(acme, key_ids, 60, seed=1)
    # Written as the usage writer writes them: several batches.
    for start in range(0, len(rows), 25):
        write_usage_records(db, rows[start : start + 25])
    write_usage_records(db, make_rows(umbrella, [other_key_id], 10, seed=2))  # must not leak into acme's totals

    # UsageGroup -> (the UsageTotals fields it sets, the group of a row); never the runtime key.
    groupings = {
        UsageGroup.adapter: (("adapter",), lambda row: (row["adapter_name"] or BASE_ADAPTER,)),
        UsageGroup.version: (("adapter", "version"),
                             lambda row: (row["adapter_name"] or BASE_ADAPTER, row["adapter_version"])),
        UsageGroup.alias: (("adapter", "alias"),
                           lambda row: (row["adapter_name"] or BASE_ADAPTER, row["adapter_alias"])),
        UsageGroup.key: (("api_key_id",), lambda row: (str(row["api_key_id"]),)),
        UsageGroup.day: (("day",), lambda row: (row["created_at"].date().isoformat(),)),
    }
    with db() as session:
        for group_by, (fields, group_of) in groupings.items():
            totals = aggregate_usage(session, tenant_id=acme, group_by=group_by, start=None, end=None)
            want = expected(rows, group_of)
            groups = [tuple(getattr(t, field) for field in fields) for t in totals]
            assert groups == sorted(want, key=by_group), group_by
            for entry, group in zip(totals, groups):
                assert entry.adapter is None or "/" not in entry.adapter  # never a runtime key
                reference = want[group]
                assert entry.requests == reference["requests"]
                assert (entry.errors, entry.aborted) == (reference["errors"], reference["aborted"])
                assert entry.prompt_tokens == reference["prompt_tokens"]
                assert entry.completion_tokens == reference["completion_tokens"]
                assert entry.cached_tokens == reference["cached_tokens"]
                assert entry.mean_duration_ms == pytest.approx(reference["duration_ms"])
                if reference["ttft"] is None:
                    assert entry.mean_time_to_first_token_ms is None
                else:
                    assert entry.mean_time_to_first_token_ms == pytest.approx(reference["ttft"])
                assert entry.api_key_prefix == (prefixes[group[0]] if group_by is UsageGroup.key else None)

        # [start, end): the middle day only.
        start, end = datetime(2026, 11, 21, tzinfo=timezone.utc), datetime(2026, 11, 22, tzinfo=timezone.utc)
        window = aggregate_usage(session, tenant_id=acme, group_by=UsageGroup.adapter, start=start, end=end)
        inside = [row for row in rows if start <= row["created_at"] < end]
        assert sum(t.requests for t in window) == len(inside) > 0
        assert sum(t.prompt_tokens for t in window) == sum(row["prompt_tokens"] for row in inside)

        assert sum(t.requests for t in aggregate_usage(
            session, tenant_id=umbrella, group_by=UsageGroup.day, start=None, end=None
        )) == 10
        assert session.query(UsageRecord).count() == 70
