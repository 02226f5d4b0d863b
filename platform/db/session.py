"""Engines and sessions for SQLite (the laptop default) and PostgreSQL."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_S = 30


def create_db_engine(database_url: str, *, enforce_foreign_keys: bool = True) -> Engine:
    """An engine for `database_url`; a SQLite file's directory is created if missing.

    `enforce_foreign_keys=False` is for migrations only (see migrate.py); PostgreSQL always enforces.
    """
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    # check_same_thread off: sessions are used from the web server's worker threads, one at a time.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # SQLite ignores foreign keys (and their ON DELETE actions) unless asked, per connection.
        cursor.execute(f"PRAGMA foreign_keys={'ON' if enforce_foreign_keys else 'OFF'}")
        # WAL lets readers (gateway) and a writer (worker) use the file at the same time.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine


def create_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit off: rows returned by a service function stay readable after its commit.
    return sessionmaker(engine, expire_on_commit=False)
