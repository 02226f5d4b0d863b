"""An async stream read ahead by one task into a queue, so its consumer can wait on it with a timeout
or be interrupted (a key revoked) at no cost per item.

Waiting on a stream's next item alongside something else (a keep-alive timer, a revocation) by
wrapping each `anext()` in a task of its own costs a task creation or two per token: at thousands
of tokens a second, the gateway's largest per-token cost. An Inbox starts one task per stream
instead, and the consumer waits on a queue, which `asyncio.timeout` can cut short without losing
an item.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")

_END = object()  # the stream ended; or, with an exception beside it, failed or was interrupted


class Inbox(Generic[T]):
    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        self._queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
        self._interruption: BaseException | None = None
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for item in self._source:
                self._queue.put_nowait((item, None))
        except Exception as error:  # handed to the consumer, raised where it waits
            self._queue.put_nowait((_END, error))
        else:
            self._queue.put_nowait((_END, None))

    def interrupt(self, error: BaseException) -> None:
        """Have the consumer's waits raise `error` from now on, items already read or not."""
        self._interruption = error
        self._queue.put_nowait((_END, error))  # wakes a consumer waiting now

    async def next(self) -> T:
        """The next item; StopAsyncIteration at the end, the stream's error, or an interruption's.
        Cancelling this wait (a timeout) loses no item."""
        if self._interruption is not None:
            raise self._interruption
        item, error = await self._queue.get()
        if self._interruption is not None:
            raise self._interruption
        if item is _END:
            self._queue.put_nowait((item, error))  # every later call ends the same way
            raise error if error is not None else StopAsyncIteration
        return item  # type: ignore[return-value]  # anything but the marker came from the source

    async def close(self) -> None:
        """Stop reading: the reader is cancelled, which closes the source where it waited, and a source
        never started is closed too (an async generator's `finally` then runs)."""
        self._reader.cancel()
        await asyncio.wait([self._reader])  # not `await`: the reader's cancellation is not the caller's
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()
