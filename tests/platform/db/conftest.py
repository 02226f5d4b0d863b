"""Each DB test runs on a fresh SQLite file and on a throwaway PostgreSQL database.

PostgreSQL comes from LORALOOM_TEST_POSTGRES_URL (default: the local trust-auth server's
`test` database). Each test creates its own database next to it and drops it afterwards,
so parallel or repeated runs never see each other's tables.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database

POSTGRES_URL = os.environ.get("LORALOOM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
    try:
        with engine.connect():
            pass
    except OperationalError as error:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL} (set LORALOOM_TEST_POSTGRES_URL): {error}")
    finally:
        engine.dispose()
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'loraloom.db'}"
        return
    admin_url = request.getfixturevalue("postgres_admin_url")
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


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade_database(database_url)
    return database_url


@pytest.fixture
def session(migrated_url: str) -> Iterator[Session]:
    engine = create_db_engine(migrated_url)
    try:
        with create_session_factory(engine)() as db_session:
            yield db_session
    finally:
        engine.dispose()
