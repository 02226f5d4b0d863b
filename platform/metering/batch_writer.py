"""Write records to the database off the request path, in batches.

Requests hand records to `submit()`, which only appends to a list: it never waits for the
database. A background task writes them in a worker thread every `flush_interval_s`, or at
once when `max_batch` records are pending; `close()` writes whatever is left (the server's
shutdown calls it). Usage metering, API-key last-used times and the audit log share this.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from starlette.concurrency import run_in_threadpool

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BACKOFF_S = 30.0  # the longest wait between two attempts at a failing database
CLOSE_ATTEMPTS = 3  # failed writes after shutdown began before the rest is given up


class BatchWriter(Generic[T]):
    """`write(batch)` runs in a thread, one batch (at most `max_batch` records) at a time.

    Not thread-safe: `submit` is called from the event loop. A failed write is retried with
    back-off and its records kept until written. Past `max_pending` records (the database is
    down or too slow) new records are dropped, logged and counted (`dropped`, DroppedRecordsCollector), rather
    than holding requests or growing memory without bound.
    """

    def __init__(
        self,
        write: Callable[[Sequence[T]], None],
        *,
        name: str,
        flush_interval_s: float,
        max_batch: int,
        max_pending: int,
    ) -> None:
        if flush_interval_s <= 0 or max_batch < 1 or max_pending < max_batch:
            raise ValueError(
                f"{name} writer: need flush_interval_s > 0 and 1 <= max_batch <= max_pending, got "
                f"flush_interval_s={flush_interval_s}, max_batch={max_batch}, max_pending={max_pending}"
            )
        self.write = write
        self.name = name
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.dropped = 0  # records lost to a full buffer or a database still failing at shutdown
        self._failures = 0  # consecutive failed writes
        self._pending: list[T] = []
        self._has_pending = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def submit(self, record: T) -> None:
        if self._closing and self._task is not None and self._task.done():
            # A request that outlived the server's shutdown (e.g. a stream closed by the garbage collector).
            self._drop(1, "it arrived after the writer closed")
            return
        if len(self._pending) >= self.max_pending:
            self._drop(1, f"{len(self._pending)} records pending (database down or too slow?)")
            return
        self._pending.append(record)
        self._has_pending.set()
        if len(self._pending) >= self.max_batch:
            self._batch_full.set()

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"{self.name} writer: already started")
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-writer")

    async def close(self) -> None:
        """Write everything submitted so far, then stop."""
        self._closing = True
        self._has_pending.set()
        self._batch_full.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            await self._has_pending.wait()  # idle until the first record arrives
            if not self._closing:
                try:
                    # Gather more records for up to one interval, unless a batch fills first.
                    await asyncio.wait_for(self._batch_full.wait(), self.flush_interval_s)
                except asyncio.TimeoutError:
                    pass
            await self._write_pending()
            if self._failures and self._closing and self._failures >= CLOSE_ATTEMPTS:
                self._drop(len(self._pending), "the database is still failing at shutdown")
                self._pending = []
            if self._closing and not self._pending:
                return
            if self._failures:
                # Back off (doubling, capped) so that a database that is down is not hammered.
                await asyncio.sleep(min(MAX_BACKOFF_S, self.flush_interval_s * 2 ** (self._failures - 1)))

    async def _write_pending(self) -> None:
        # Records submitted while a batch is being written land in the fresh list and
        # set the events again, so the loop comes back for them.
        pending, self._pending = self._pending, []
        self._has_pending.clear()
        self._batch_full.clear()
        for start in range(0, len(pending), self.max_batch):
            batch = pending[start : start + self.max_batch]
            try:
                await run_in_threadpool(self.write, batch)
            except Exception:
                # A write is one transaction, rolled back when it fails: the batch and those after it
                # are kept, oldest first, and written again after a back-off (usage rows are billing data).
                self._failures += 1
                logger.exception("%s writer: %d records not written yet (attempt %d); retrying",
                                 self.name, len(pending) - start, self._failures)
                self._requeue(pending[start:])
                return
        self._failures = 0

    def _requeue(self, unwritten: list[T]) -> None:
        kept = unwritten + self._pending
        if len(kept) > self.max_pending:  # the newest go, as submit() refuses them once full
            self._drop(len(kept) - self.max_pending, "the buffer is full while the database fails")
            kept = kept[: self.max_pending]
        self._pending = kept
        self._has_pending.set()

    def _drop(self, count: int, why: str) -> None:
        if count:
            self.dropped += count
            logger.error("%s writer: %d records lost: %s", self.name, count, why)


class DroppedRecordsCollector:
    """Prometheus: each writer's dropped count, read at scrape time (a collector, not a global
    Counter, because every app has its own registry and its own writers)."""

    def __init__(self, writers: Callable[[], Sequence[BatchWriter[object]]]) -> None:
        self.writers = writers

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("loraloom_records_dropped", "Usage, audit and key last-used records lost "
                                     "(buffer full, or the database still failing at shutdown)", labels=["writer"])
        for writer in self.writers():
            family.add_metric([writer.name], writer.dropped)
        yield family
