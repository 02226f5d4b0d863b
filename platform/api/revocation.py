"""Ending a key's generations in flight when it is revoked or expires.

A key is checked once, when its request arrives (api/auth.py); a stream may last minutes after
that. Each gateway keeps the keys of its open generations (KeyWatch) and reads them from the
database every POLL_INTERVAL_S, in one query for all of them, only while some are open: so a
revocation made through any gateway on the same database, or an expiry passing, ends them within
a second. A tenant suspended by the operator ends its keys' generations the same way. An ended
stream gets a last SSE error event in OpenAI's shape (`api_key_revoked`, `api_key_expired`,
`tenant_suspended`), a request not streaming that error's status (401, or 403 for a suspension); either way the engine's request is aborted,
which frees its KV blocks.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraloom.platform.api.auth import check_usable
from loraloom.platform.api.errors import APIError
from loraloom.platform.api.inbox import Inbox
from loraloom.platform.db.models import ApiKey, utcnow

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
T = TypeVar("T")


class Revocation:
    """One request's watch on its key: set, with the 401 to answer, when the key stops being usable."""

    def __init__(self) -> None:
        self._ended = asyncio.Event()
        self.error: APIError | None = None
        self._listeners: list[Callable[[], None]] = []

    def end(self, error: APIError) -> None:
        if not self._ended.is_set():
            self.error = error
            self._ended.set()
            for listener in list(self._listeners):
                listener()

    def on_end(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` when the key ends (at once if it already has); returns the unsubscribe."""
        self._listeners.append(listener)
        if self.error is not None:
            listener()
        return lambda: self._listeners.remove(listener)

    async def guard(self, work: Awaitable[T]) -> T:
        """`work`'s result; if the key is revoked first, `work` is cancelled and the 401 raised.
        Two tasks a call: for one-off waits (a generation's start); a stream's tokens use revocable."""
        task = asyncio.ensure_future(work)
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not task.done():  # revoked, or this request cancelled (its client left)
                # A generation cancelled mid-way aborts its engine requests (api/generation/choices.py).
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task.cancelled():
            assert self.error is not None
            raise self.error
        return task.result()


async def revocable(outputs: AsyncGenerator[T, None], revocation: Revocation) -> AsyncIterator[T]:
    """`outputs`, until they end or the key is revoked (then the revocation's 401 is raised). Leaving
    early (a revocation, the client gone) closes `outputs`, which aborts the engine's requests."""
    inbox = Inbox(outputs)  # one task per stream, none per token (api/inbox.py)
    unsubscribe = revocation.on_end(lambda: inbox.interrupt(revocation.error))
    try:
        while True:
            try:
                item = await inbox.next()
            except StopAsyncIteration:
                return
            yield item
    finally:
        unsubscribe()
        await inbox.close()


class KeyWatch:
    """A gateway's open generations by API key, and the poller that ends those whose key was revoked."""

    def __init__(self, session_factory: sessionmaker[Session], interval_s: float = POLL_INTERVAL_S) -> None:
        self._session_factory = session_factory
        self._interval_s = interval_s
        # Weak: a request's Revocation goes when the request does, however it ended.
        self._open: dict[uuid.UUID, weakref.WeakSet[Revocation]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, api_key_id: uuid.UUID | None) -> Revocation:
        revocation = Revocation()
        if api_key_id is not None:  # None: the server acting for a tenant, no key to revoke
            self._open.setdefault(api_key_id, weakref.WeakSet()).add(revocation)
        return revocation

    def watched_keys(self) -> list[uuid.UUID]:
        for key_id in [key_id for key_id, open_ in self._open.items() if not open_]:
            del self._open[key_id]
        return list(self._open)

    def end(self, api_key_id: uuid.UUID, error: APIError) -> None:
        for revocation in list(self._open.pop(api_key_id, ())):
            revocation.end(error)

    def ended_keys(self, key_ids: list[uuid.UUID]) -> dict[uuid.UUID, APIError]:
        """Of `key_ids`, those no longer usable (revoked, expired, deleted, tenant suspended), with the error each gets."""
        with self._session_factory() as session:
            # The tenant too: a suspended tenant's streams end like a revoked key's.
            query = select(ApiKey).where(ApiKey.id.in_(key_ids)).options(joinedload(ApiKey.tenant))
            keys = {key.id: key for key in session.scalars(query)}
        now = utcnow()
        ended = {}
        for key_id in key_ids:
            try:
                check_usable(keys.get(key_id), now)
            except APIError as error:
                ended[key_id] = error
        return ended

    async def poll_once(self) -> None:
        key_ids = self.watched_keys()
        if not key_ids:
            return
        for key_id, error in (await run_in_threadpool(self.ended_keys, key_ids)).items():
            self.end(key_id, error)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll_once()
            except Exception:  # the database away for a moment: keep serving, try again next time
                logger.exception("could not check the API keys of open generations")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
