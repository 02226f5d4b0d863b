"""BatchWriter: records submitted from the event loop reach `write` in batches of at most
max_batch, by size or by interval, all of them by close(); a full buffer or a failing
write loses records (counted and logged) but never blocks nor stops the writer. On a real
PostgreSQL database that goes away and comes back, usage rows are all written, each once,
and those past the bound are counted in the loraloom_records_dropped metric."""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import uuid
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database
from loraloom.platform.db.models import UsageRecord, UsageStatus, utcnow
from loraloom.platform.metering.batch_writer import BatchWriter, DroppedRecordsCollector
from loraloom.platform.metering.usage import write_usage_records

LONG_INTERVAL_S = 3600.0  # never reached in a test: flushes come from size or close()


class Recorder:
    """A real `write`: keeps each batch, and the thread it ran on."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.fail_on_batch = fail_on_batch
        self.calls = 0

    def __call__(self, batch: Sequence[int]) -> None:
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self.calls == self.fail_on_batch:
            raise RuntimeError("database unavailable")
        self.batches.append(list(batch))

    @property
    def written(self) -> int:
        return sum(len(batch) for batch in self.batches)


async def until(condition, what: str) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def test_full_batches_are_written_at_once_and_close_writes_the_rest():
    recorder = Recorder()

    async def scenario() -> None:
        writer = BatchWriter(recorder, name="test", flush_interval_s=LONG_INTERVAL_S, max_batch=4, max_pending=100)
        writer.start()
        for record in range(10):
            writer.submit(record)  # never awaits: a request is not held up
        await until(lambda: recorder.written == 10, "the full batches")
        assert recorder.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        for record in range(10, 13):
            writer.submit(record)
        await writer.close()  # long before the interval ends
        assert recorder.batches[-1] == [10, 11, 12]
        assert writer.dropped == 0
        assert threading.get_ident() not in recorder.threads  # written off the event loop's thread

    asyncio.run(scenario())


def test_a_partial_batch_is_written_after_the_interval():
    recorder = Recorder()

    async def scenario() -> None:
        writer = BatchWriter(recorder, name="test", flush_interval_s=0.01, max_batch=100, max_pending=1000)
        writer.start()
        for record in range(3):
            writer.submit(record)
        await until(lambda: recorder.written == 3, "the interval flush")
        assert recorder.batches == [[0, 1, 2]]
        writer.submit(3)
        await until(lambda: recorder.written == 4, "the second interval flush")
        assert recorder.batches == [[0, 1, 2], [3]]
        await writer.close()

    asyncio.run(scenario())


def test_records_past_max_pending_are_dropped_and_logged(caplog):
    recorder = Recorder()

    async def scenario() -> BatchWriter[int]:
        writer = BatchWriter(recorder, name="usage", flush_interval_s=LONG_INTERVAL_S, max_batch=2, max_pending=5)
        for record in range(7):  # the writer is not running yet: nothing drains the buffer
            writer.submit(record)
        writer.start()
        await writer.close()
        return writer

    with caplog.at_level(logging.ERROR):
        writer = asyncio.run(scenario())
    assert recorder.batches == [[0, 1], [2, 3], [4]]
    assert writer.dropped == 2
    assert "usage writer" in caplog.text and "records lost" in caplog.text


def test_a_failed_write_is_kept_and_retried_none_lost_none_doubled(caplog):
    recorder = Recorder(fail_on_batch=1)

    async def scenario() -> BatchWriter[int]:
        # A short interval: the retry waits one back-off, which starts at the flush interval.
        writer = BatchWriter(recorder, name="audit", flush_interval_s=0.01, max_batch=2, max_pending=10)
        writer.start()
        for record in range(4):
            writer.submit(record)
        await until(lambda: recorder.written == 4, "the retried batches")
        writer.submit(4)
        await writer.close()
        return writer

    with caplog.at_level(logging.ERROR):
        writer = asyncio.run(scenario())
    assert [record for batch in recorder.batches for record in batch] == [0, 1, 2, 3, 4]
    assert recorder.calls == len(recorder.batches) + 1  # the one failed call wrote nothing
    assert writer.dropped == 0
    assert "records not written yet (attempt 1); retrying" in caplog.text


@pytest.mark.parametrize(
    ("interval", "max_batch", "max_pending"), [(0, 1, 1), (1, 0, 1), (1, 10, 5)]
)
def test_bad_sizes_are_refused_naming_the_writer(interval, max_batch, max_pending):
    with pytest.raises(ValueError, match="usage writer"):
        BatchWriter(Recorder(), name="usage", flush_interval_s=interval, max_batch=max_batch, max_pending=max_pending)


# ------------------------------------------------------------------ a real database going away
class PostgresOutage:
    """Makes a PostgreSQL database refuse every write, as a restarting server does: new connections
    are refused (ALLOW_CONNECTIONS false) and the open ones are cut. `end()` lets them in again."""

    def __init__(self, admin_url: str, database_url: str) -> None:
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.name = make_url(database_url).database

    def _run(self, statement: str) -> None:
        with self.admin.connect() as connection:
            connection.execute(text(statement), {"name": self.name})

    def begin(self) -> None:
        self._run(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
        self._run("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name")

    def end(self) -> None:
        self._run(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')
        self.admin.dispose()


@pytest.fixture
def usage_database(postgres_admin_url, postgres_database_url):
    """(session factory, outage switch) on a throwaway, migrated PostgreSQL database."""
    upgrade_database(postgres_database_url)
    db_engine = create_db_engine(postgres_database_url)
    outage = PostgresOutage(postgres_admin_url, postgres_database_url)
    try:
        yield create_session_factory(db_engine), outage
    finally:
        outage.end()  # whatever the test did: the fixture drops the database next
        db_engine.dispose()


def usage_row(number: int) -> dict:
    return {"tenant_id": uuid.UUID(int=1), "api_key_id": None, "adapter_version_id": None, "adapter_key": None,
            "model": "base", "request_id": f"req-{number}", "endpoint": "completions", "status": UsageStatus.ok,
            "prompt_tokens": number, "completion_tokens": 1, "cached_tokens": 0, "time_to_first_token_ms": 1.0,
            "duration_ms": 2.0, "created_at": utcnow()}


def stored_request_ids(factory) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(UsageRecord.request_id)))


def retries_logged(caplog) -> int:
    return sum("records not written yet" in record.getMessage() for record in caplog.records)


def test_usage_rows_survive_a_database_outage_none_lost_none_doubled(usage_database, caplog):
    factory, outage = usage_database

    async def scenario() -> BatchWriter[dict]:
        writer = BatchWriter(functools.partial(write_usage_records, factory), name="usage", flush_interval_s=0.01,
                             max_batch=5, max_pending=1000)
        writer.start()
        for number in range(10):
            writer.submit(usage_row(number))
        await until(lambda: len(stored_request_ids(factory)) == 10, "the rows before the outage")
        outage.begin()
        for number in range(10, 40):
            writer.submit(usage_row(number))
        await until(lambda: retries_logged(caplog) >= 2, "writes failing while the database is down")
        outage.end()
        for number in range(40, 50):
            writer.submit(usage_row(number))
        await writer.close()
        return writer

    writer = asyncio.run(scenario())
    stored = stored_request_ids(factory)
    assert sorted(stored) == sorted(f"req-{number}" for number in range(50))  # each once: none lost, none doubled
    assert writer.dropped == 0


def test_rows_past_the_bound_during_an_outage_are_dropped_and_counted_in_the_metric(usage_database, caplog):
    factory, outage = usage_database
    registry = CollectorRegistry()

    async def scenario() -> None:
        writer = BatchWriter(functools.partial(write_usage_records, factory), name="usage", flush_interval_s=0.01,
                             max_batch=5, max_pending=10)
        registry.register(DroppedRecordsCollector(lambda: [writer]))
        writer.start()
        outage.begin()
        for number in range(5):
            writer.submit(usage_row(number))
        await until(lambda: retries_logged(caplog) >= 1, "the first batch failing")
        for number in range(5, 15):  # 10 kept (the bound), the 5 newest dropped
            writer.submit(usage_row(number))
        assert registry.get_sample_value("loraloom_records_dropped_total", {"writer": "usage"}) == 5
        outage.end()
        await writer.close()

    asyncio.run(scenario())
    assert sorted(stored_request_ids(factory)) == sorted(f"req-{number}" for number in range(10))
    assert registry.get_sample_value("loraloom_records_dropped_total", {"writer": "usage"}) == 5
