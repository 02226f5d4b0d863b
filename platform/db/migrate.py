"""Apply the Alembic migrations in <repo>/migrations to a database.

The migrations folder is found relative to this file (platform/db/migrate.py -> ../../migrations),
which holds for a source checkout and an editable install; a wheel must ship it alongside.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, text

from loraloom.platform.db.session import create_db_engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
MIGRATION_LOCK_ID = 0x6C6F72616C6F6F6D  # "loraloom": a fixed key for PostgreSQL's advisory lock


def alembic_config(connection: Connection) -> Config:
    """An Alembic config that runs on `connection` (migrations/env.py picks it up)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"migrations: {MIGRATIONS_DIR / 'env.py'} not found; "
            "install loraloom from a source checkout (pip install -e .)"
        )
    config = Config()  # migrations/alembic.ini only serves the alembic command line
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@contextmanager
def migration_connection(database_url: str) -> Iterator[Connection]:
    """A connection in a transaction, committed when the block ends without error."""
    # SQLite foreign keys off while migrating: batch migrations rebuild a table by copy,
    # drop and rename, and with enforcement on the drop would cascade into other tables.
    engine = create_db_engine(database_url, enforce_foreign_keys=False)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Gateway, engine and worker processes may all start at once and upgrade:
                # the first holds this lock until it commits, the others then find nothing to do.
                connection.execute(text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": MIGRATION_LOCK_ID})
            yield connection
            if connection.dialect.name == "sqlite":
                violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if violations:
                    raise RuntimeError(f"migrations: they left rows with dangling foreign keys: {violations[:5]}")
    finally:
        engine.dispose()  # its connections have enforcement off: never reuse them


def upgrade_database(database_url: str, revision: str = "head") -> None:
    """Bring the schema at `database_url` up to `revision`, creating it from empty if needed."""
    with migration_connection(database_url) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade_database(database_url: str, revision: str) -> None:
    with migration_connection(database_url) as connection:
        command.downgrade(alembic_config(connection), revision)


def database_revision(database_url: str) -> str | None:
    """The revision the database is at; None for a database never migrated."""
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
