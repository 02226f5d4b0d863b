"""The adapter change listener on a real PostgreSQL: a committed announcement invalidates that
tenant's adapter in the resolution cache and nothing else; a rolled-back one reaches nobody; a
dropped connection suspends the cache, and listening again forgets everything cached. SQLite has
nothing to listen to."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_api import wait_until
from sqlalchemy import event, text

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.change_listener import (
    APPLICATION_NAME,
    InProcessChangeListener,
    PostgresChangeListener,
    change_listener_for,
)
from loraloom.platform.db.changes import AdapterChange, announce_adapter_change
from loraloom.platform.registry.references import parse_reference
from loraloom.platform.registry.resolution import ResolutionCache

HOUR_S = 3600.0  # entries never expire during a test: only invalidation clears them
ACME, GLOBEX = uuid.UUID(int=1), uuid.UUID(int=2)
WAIT_S = 10.0  # generous: delivery takes milliseconds (no timing is asserted)


class CountingCache:
    """A ResolutionCache and how often each (tenant, reference) had to be loaded from the 'database'."""

    def __init__(self) -> None:
        self.cache = ResolutionCache(capacity=100, ttl_s=HOUR_S)
        self.loads: dict[tuple[uuid.UUID, str], int] = {}

    def ask(self, tenant_id: uuid.UUID, reference_text: str) -> None:
        def load() -> None:
            key = (tenant_id, reference_text)
            self.loads[key] = self.loads.get(key, 0) + 1

        reference = parse_reference(reference_text)
        assert reference is not None
        self.cache.get_or_load(tenant_id, reference, load)

    def reloaded(self, asked: list[tuple[uuid.UUID, str]]) -> list[tuple[uuid.UUID, str]]:
        """Ask each again: the ones that went to the 'database' (their entry was gone)."""
        before = dict(self.loads)
        for tenant_id, reference_text in asked:
            self.ask(tenant_id, reference_text)
        return [key for key in asked if self.loads[key] > before.get(key, 0)]


WARM = [(ACME, "bot"), (ACME, "bot:prod"), (ACME, "bot@2"), (GLOBEX, "bot"), (ACME, "other")]


@pytest.fixture
def counting() -> CountingCache:
    return CountingCache()


@pytest.fixture
def listener(postgres_database_url: str, counting: CountingCache) -> Iterator[PostgresChangeListener]:
    listener = change_listener_for(postgres_database_url, counting.cache)
    assert isinstance(listener, PostgresChangeListener)
    listener.start()
    try:
        wait_until(lambda: listener.listening, "the listener to listen", WAIT_S)
        yield listener
    finally:
        listener.stop()


@pytest.fixture
def sessions(postgres_database_url: str):
    engine = create_db_engine(postgres_database_url)
    try:
        yield create_session_factory(engine)
    finally:
        engine.dispose()


def announce(sessions, tenant_id: uuid.UUID, name: str, *, commit: bool = True) -> None:
    with sessions() as session:
        announce_adapter_change(session, tenant_id=tenant_id, adapter_name=name)
        if commit:
            session.commit()
        else:
            session.rollback()


def warm(counting: CountingCache) -> None:
    for tenant_id, reference_text in WARM:
        counting.ask(tenant_id, reference_text)
    assert counting.reloaded(WARM) == []  # all cached


def test_a_notification_invalidates_that_tenants_adapter_and_nothing_else(listener, counting, sessions):
    warm(counting)
    announce(sessions, ACME, "bot")
    wait_until(lambda: listener.notifications_received == 1, "the notification", WAIT_S)
    # Every reference to acme's bot goes back to the database; globex's bot and acme's other stay cached.
    assert counting.reloaded(WARM) == [(ACME, "bot"), (ACME, "bot:prod"), (ACME, "bot@2")]


def test_a_rolled_back_change_notifies_nobody(listener, counting, sessions):
    warm(counting)
    announce(sessions, ACME, "bot", commit=False)
    announce(sessions, ACME, "other")
    # PostgreSQL delivers in commit order: once the second arrived, the first would have come before it.
    wait_until(lambda: listener.notifications_received >= 1, "the committed notification", WAIT_S)
    assert listener.notifications_received == 1
    assert counting.reloaded(WARM) == [(ACME, "other")]


def test_a_dropped_connection_suspends_the_cache_and_listening_again_forgets_everything(
    listener, counting, sessions
):
    warm(counting)
    with sessions() as session:
        ended = session.execute(
            text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = :name AND datname = current_database()"),
            {"name": APPLICATION_NAME},
        ).scalars().all()
    assert ended == [True]
    wait_until(lambda: listener.connections == 2 and listener.listening, "the listener to reconnect", WAIT_S)
    # Changes made while it was away were unheard: nothing cached before survives.
    assert counting.reloaded(WARM) == WARM
    assert counting.reloaded(WARM) == []  # and it caches again
    announce(sessions, GLOBEX, "bot")
    wait_until(lambda: listener.notifications_received == 1, "a notification after the reconnection", WAIT_S)
    assert counting.reloaded(WARM) == [(GLOBEX, "bot")]


def test_a_malformed_notification_forgets_everything(listener, counting, sessions):
    warm(counting)
    with sessions() as session:
        session.execute(text("SELECT pg_notify('loraloom_adapter_changes', 'not json')"))
        session.commit()
    wait_until(lambda: listener.notifications_received == 1, "the notification", WAIT_S)
    assert counting.reloaded(WARM) == WARM


def test_a_suspended_cache_answers_from_the_database_until_reset(counting):
    warm(counting)
    counting.cache.suspend()
    assert counting.reloaded(WARM) == WARM
    assert counting.reloaded(WARM) == WARM  # nothing is kept while suspended
    counting.cache.reset()
    assert counting.reloaded(WARM) == WARM
    assert counting.reloaded(WARM) == []


def test_payloads_round_trip_and_foreign_ones_are_refused():
    change = AdapterChange(tenant_id=ACME, adapter_name="bot")
    assert AdapterChange.from_payload(change.payload()) == change
    for foreign in ("not json", "[]", '{"tenant_id": "nope", "adapter": "bot"}', '{"adapter": "bot"}'):
        with pytest.raises(ValueError, match="not an adapter change"):
            AdapterChange.from_payload(foreign)


def test_sqlite_has_nothing_to_listen_to_and_announces_nothing(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    assert isinstance(change_listener_for(url, ResolutionCache(capacity=1, ttl_s=1.0)), InProcessChangeListener)
    engine = create_db_engine(url)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        with create_session_factory(engine)() as session:
            announce_adapter_change(session, tenant_id=ACME, adapter_name="bot")
            session.commit()
    finally:
        engine.dispose()
    assert statements == []
