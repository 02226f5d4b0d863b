"""Throwaway PostgreSQL databases beside the test server's (tests/platform/conftest.py's fixtures and
benchmarks that need PostgreSQL use them). The server comes from LORALOOM_TEST_POSTGRES_URL (default:
the local trust-auth server's `test` database)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

POSTGRES_URL = os.environ.get("LORALOOM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def throwaway_postgres_database(admin_url: str) -> Iterator[str]:
    """A new, empty database beside `admin_url`'s, dropped (its connections cut) at the end; yields its URL."""
    name = f"loraloom_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")  # CREATE DATABASE refuses transactions
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
