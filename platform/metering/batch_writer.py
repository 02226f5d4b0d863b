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

from starlette.concurrency import run_in_threadpool

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BatchWriter(Generic[T]):
    """`write(batch)` runs in a thread, one batch (at most `max_batch` records) at a time.

    Not thread-safe: `submit` is called from the event loop. Past `max_pending` records
    (the database is down or too slow) new records are dropped with an error in the log,
    rather than holding requests or growing memory without bound.
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
        self.dropped = 0  # records lost to a full buffer or a failed write
        self._pending: list[T] = []
        self._has_pending = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def submit(self, record: T) -> None:
        if self._closing and self._task is not None and self._task.done():
            # A request that outlived the server's shutdown (e.g. a stream closed by the garbage collector).
            self.dropped += 1
            logger.error("%s writer: a record arrived after the writer closed; dropped", self.name)
            return
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            logger.error("%s writer: %d records pending, dropping one (database down or too slow?)",
                         self.name, len(self._pending))
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
            if self._closing and not self._pending:
                return

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
                self.dropped += len(batch)
                logger.exception("%s writer: %d records could not be written and are lost", self.name, len(batch))
