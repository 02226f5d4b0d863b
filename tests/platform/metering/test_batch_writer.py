"""BatchWriter: records submitted from the event loop reach `write` in batches of at most
max_batch, by size or by interval, all of them by close(); a full buffer or a failing
write loses records (counted and logged) but never blocks nor stops the writer."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

import pytest

from loraloom.platform.metering.batch_writer import BatchWriter

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
    assert "usage writer" in caplog.text and "dropping" in caplog.text


def test_a_failed_write_loses_its_batch_but_not_the_writer(caplog):
    recorder = Recorder(fail_on_batch=1)

    async def scenario() -> BatchWriter[int]:
        writer = BatchWriter(recorder, name="audit", flush_interval_s=LONG_INTERVAL_S, max_batch=2, max_pending=10)
        writer.start()
        for record in range(4):
            writer.submit(record)
        await until(lambda: recorder.calls == 2, "both batches")
        writer.submit(4)
        await writer.close()
        return writer

    with caplog.at_level(logging.ERROR):
        writer = asyncio.run(scenario())
    assert recorder.batches == [[2, 3], [4]]
    assert writer.dropped == 2
    assert "2 records could not be written" in caplog.text


@pytest.mark.parametrize(
    ("interval", "max_batch", "max_pending"), [(0, 1, 1), (1, 0, 1), (1, 10, 5)]
)
def test_bad_sizes_are_refused_naming_the_writer(interval, max_batch, max_pending):
    with pytest.raises(ValueError, match="usage writer"):
        BatchWriter(Recorder(), name="usage", flush_interval_s=interval, max_batch=max_batch, max_pending=max_pending)
