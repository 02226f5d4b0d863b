"""api/inbox.py: a stream read ahead by one task, waited on with timeouts or interrupted, never losing
or reordering an item, and closing its source however the consumer leaves."""
from __future__ import annotations

import asyncio

import pytest

from loraloom.platform.api.inbox import Inbox


class Source:
    """An async generator's stand-in that records what happened to it: items are released one by one
    through `release`, and `closed` is set by its `finally`."""

    def __init__(self) -> None:
        self.released: asyncio.Queue[int | BaseException | None] = asyncio.Queue()
        self.closed = False
        self.started = False

    async def items(self):
        self.started = True
        try:
            while (item := await self.released.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.closed = True


async def drain(inbox: Inbox) -> list[int]:
    items = []
    while True:
        try:
            items.append(await inbox.next())
        except StopAsyncIteration:
            return items


def test_items_arrive_in_order_and_a_timeout_loses_none():
    async def scenario():
        source = Source()
        inbox = Inbox(source.items())
        with pytest.raises(TimeoutError):  # nothing released yet
            async with asyncio.timeout(0.01):
                await inbox.next()
        for item in (1, 2, 3):
            source.released.put_nowait(item)
        source.released.put_nowait(None)
        items = await drain(inbox)
        with pytest.raises(StopAsyncIteration):  # the end stays the end
            await inbox.next()
        await inbox.close()
        return items, source.closed

    items, closed = asyncio.run(scenario())
    assert items == [1, 2, 3]
    assert closed


def test_the_source_error_reaches_the_consumer_after_the_items_before_it():
    async def scenario():
        source = Source()
        inbox = Inbox(source.items())
        source.released.put_nowait(7)
        source.released.put_nowait(ValueError("engine failed"))
        first = await inbox.next()
        with pytest.raises(ValueError, match="engine failed"):
            await inbox.next()
        await inbox.close()
        return first

    assert asyncio.run(scenario()) == 7


def test_an_interruption_wins_over_items_already_read_and_close_ends_the_source():
    async def scenario():
        source = Source()
        inbox = Inbox(source.items())
        source.released.put_nowait(1)
        source.released.put_nowait(2)
        assert await inbox.next() == 1
        await asyncio.sleep(0)  # the reader has item 2 queued by now, or soon: either way it must not come out
        inbox.interrupt(PermissionError("key revoked"))
        with pytest.raises(PermissionError):
            await inbox.next()
        with pytest.raises(PermissionError):  # and every wait after
            await inbox.next()
        assert not source.closed  # still waiting for item 3 in the reader
        await inbox.close()
        return source.closed

    assert asyncio.run(scenario())


def test_an_interruption_wakes_a_consumer_already_waiting():
    async def scenario():
        source = Source()
        inbox = Inbox(source.items())
        waiting = asyncio.create_task(inbox.next())
        await asyncio.sleep(0)
        inbox.interrupt(PermissionError("key revoked"))
        with pytest.raises(PermissionError):
            await waiting
        await inbox.close()
        return source.closed

    assert asyncio.run(scenario())


def test_closing_before_the_reader_ran_still_closes_the_source():
    """A consumer gone at once (the client left) closes the source too, though the reader never ran."""
    async def scenario():
        source = Source()
        generator = source.items()
        inbox = Inbox(generator)
        await inbox.close()
        with pytest.raises(StopAsyncIteration):  # closed: it yields nothing more
            await anext(generator)
        return source.started

    assert asyncio.run(scenario()) is False
