"""Each DB test runs on a fresh SQLite file and on a throwaway PostgreSQL database
(`database_url`, from tests/platform/conftest.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database


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
