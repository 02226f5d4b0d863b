"""Hearing the adapter changes other gateways announce (changes.py), to keep a cache honest.

Which listener a gateway runs follows from its database URL (`change_listener_for`):
- PostgreSQL: `PostgresChangeListener`, a thread with a connection of its own that LISTENs on
  the changes channel and invalidates the subscriber's entries for each notification, within
  milliseconds of the commit. While it is not listening (before its first connection, after the
  connection drops, until it is back) the subscriber is suspended: nothing is answered from the
  cache, since a change made meanwhile would go unheard; on every (re)connection it is reset.
- SQLite: `InProcessChangeListener`, which does nothing: one process serves the file, and its own
  routes invalidate its cache as they change the registry.
The app's lifespan starts and stops it.
"""
from __future__ import annotations

import logging
import os
import selectors
import threading
import uuid
from collections.abc import Iterable
from typing import Protocol

import psycopg
from sqlalchemy.engine import make_url

from loraloom.platform.db.changes import ADAPTER_CHANGES_CHANNEL, AdapterChange

logger = logging.getLogger(__name__)

APPLICATION_NAME = "loraloom-change-listener"  # how its connection shows in pg_stat_activity
FIRST_RETRY_S = 0.05
MAX_RETRY_S = 5.0
CONNECT_TIMEOUT_S = 5
# A peer that vanished without closing the connection (a host down, a cut cable) is noticed after
# about KEEPALIVE_IDLE_S + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL_S; until then the cache's TTL bounds staleness.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3


class ChangeSubscriber(Protocol):
    """What a listener keeps honest (registry/resolution.py's ResolutionCache)."""

    def invalidate(self, tenant_id: uuid.UUID, adapter_name: str) -> None:
        """Forget what is known of one adapter: it changed."""
        ...

    def suspend(self) -> None:
        """Changes may go unheard from now on: answer nothing from memory until `reset`."""
        ...

    def reset(self) -> None:
        """Changes are heard from now on: forget everything known (some may have been missed) and cache again."""
        ...


class ChangeListener(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class InProcessChangeListener:
    """SQLite: every change is made by this process, whose routes invalidate the cache themselves."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def libpq_url(database_url: str) -> str:
    """The SQLAlchemy URL `postgresql+psycopg://...` as libpq's `postgresql://...`."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class PostgresChangeListener:
    """LISTENs on the adapter changes channel from a thread, reconnecting with backoff."""

    def __init__(self, database_url: str, subscriber: ChangeSubscriber) -> None:
        self.conninfo = libpq_url(database_url)
        self.subscriber = subscriber
        # Read by /metrics and by tests waiting for a notification to have been applied.
        self.notifications_received = 0  # counted after the subscriber has applied them
        self.connections = 0  # times LISTEN took effect: 1 + reconnections
        self.listening = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_read = self._wake_write = -1  # a pipe stop() writes to, to wake the thread's wait

    def start(self) -> None:
        """Listen from a new thread (again after a stop: an app's lifespan may run more than once)."""
        self.subscriber.suspend()  # until LISTEN takes effect
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name="adapter-change-listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        os.write(self._wake_write, b"x")
        self._thread.join(timeout=CONNECT_TIMEOUT_S + 5)
        if not self._thread.is_alive():  # else it still selects on the pipe: leave it open
            os.close(self._wake_read)
            os.close(self._wake_write)
        self._thread = None

    def _run(self) -> None:
        retry_s = FIRST_RETRY_S
        while not self._stopping.is_set():
            try:
                with psycopg.connect(
                    self.conninfo, autocommit=True, application_name=APPLICATION_NAME,
                    connect_timeout=CONNECT_TIMEOUT_S, keepalives=1, keepalives_idle=KEEPALIVE_IDLE_S,
                    keepalives_interval=KEEPALIVE_INTERVAL_S, keepalives_count=KEEPALIVE_COUNT,
                ) as connection:
                    connection.execute(f"LISTEN {ADAPTER_CHANGES_CHANNEL}")
                    self._listening_again()
                    retry_s = FIRST_RETRY_S
                    self._follow(connection)
            except psycopg.Error as error:
                logger.warning("adapter change listener: no connection to the database (%s); retrying in %.2fs",
                               error, retry_s)
            except Exception:  # a bug: the thread must live on, or nothing would ever un-suspend the cache
                logger.exception("adapter change listener failed; retrying in %.2fs", retry_s)
            finally:
                if self.listening:
                    self.listening = False
                    self.subscriber.suspend()
            self._stopping.wait(retry_s)
            retry_s = min(2 * retry_s, MAX_RETRY_S)

    def _listening_again(self) -> None:
        self.subscriber.reset()  # what changed while nobody listened is unknown: forget it all
        self.listening = True
        self.connections += 1
        if self.connections > 1:
            logger.info("adapter change listener: listening again (connection %d)", self.connections)

    def _follow(self, connection: psycopg.Connection) -> None:
        """Apply notifications as they arrive until stop() or an error on the connection."""
        selector = selectors.DefaultSelector()
        selector.register(connection.fileno(), selectors.EVENT_READ)
        selector.register(self._wake_read, selectors.EVENT_READ)
        try:
            # timeout 0: take what has arrived (LISTEN's reply may have brought some), never wait.
            self._apply(connection.notifies(timeout=0))
            while not self._stopping.is_set():
                selector.select()  # blocks until the database sends something or stop() writes
                self._apply(connection.notifies(timeout=0))  # raises once the connection is closed
        finally:
            selector.close()

    def _apply(self, notifications: Iterable[psycopg.Notify]) -> None:
        for notification in notifications:
            try:
                change = AdapterChange.from_payload(notification.payload)
            except ValueError as error:  # what changed is unknown: forget everything
                logger.error("adapter change listener: %s", error)
                self.subscriber.reset()
            else:
                self.subscriber.invalidate(change.tenant_id, change.adapter_name)
            self.notifications_received += 1


def change_listener_for(database_url: str, subscriber: ChangeSubscriber) -> ChangeListener:
    """The listener a gateway on `database_url` runs to keep `subscriber` honest."""
    if make_url(database_url).get_backend_name() == "postgresql":
        return PostgresChangeListener(database_url, subscriber)
    return InProcessChangeListener()
