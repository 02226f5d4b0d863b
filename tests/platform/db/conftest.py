"""Each DB test runs on a fresh SQLite file and on a throwaway PostgreSQL database
(`database_url`, from tests/platform/conftest.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.db import upgrade_database


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade_database(database_url)
    return database_url


@pytest.fixture
def session(session_factory: sessionmaker[Session]) -> Iterator[Session]:
    with session_factory() as db_session:
        yield db_session
