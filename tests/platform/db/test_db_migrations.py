"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from loraloom.platform.db import create_db_engine, database_revision, downgrade_database, upgrade_database
from loraloom.platform.db.migrate import MIGRATIONS_DIR
from loraloom.platform.db.models import Base
from loraloom.platform.settings import Settings


def head_revision() -> str:
    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def table_names(database_url: str) -> set[str]:
    engine = create_db_engine(database_url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_from_empty_and_downgrade_round_trip(database_url: str) -> None:
    assert database_revision(database_url) is None
    model_tables = set(Base.metadata.tables)
    assert {"tenants", "api_keys", "adapters", "adapter_versions", "aliases", "alias_history"} <= model_tables

    upgrade_database(database_url)
    assert database_revision(database_url) == head_revision()
    assert table_names(database_url) == model_tables

    downgrade_database(database_url, "base")
    assert database_revision(database_url) is None
    assert table_names(database_url) == set()

    upgrade_database(database_url)
    assert database_revision(database_url) == head_revision()
    assert table_names(database_url) == model_tables

    upgrade_database(database_url)  # already at head: nothing to do
    assert database_revision(database_url) == head_revision()


def test_models_match_migrated_schema(migrated_url: str) -> None:
    engine = create_db_engine(migrated_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert differences == [], "models and migrations differ; add an Alembic revision for these changes"


def test_default_settings_database_is_a_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    upgrade_database(settings.database_url)
    assert (tmp_path / "data" / "loraloom.db").is_file()
    assert database_revision(settings.database_url) == head_revision()


def test_concurrent_upgrades_on_postgresql_all_succeed(database_url: str) -> None:
    # Gateway and workers may start together against one PostgreSQL database. Separate
    # processes, like in production (Alembic's context is per process, not per thread).
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite deployments run one process")
    script = "import sys; from loraloom.platform.db import upgrade_database; upgrade_database(sys.argv[1])"
    processes = [
        subprocess.Popen([sys.executable, "-c", script, database_url], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    assert database_revision(database_url) == head_revision()
    assert table_names(database_url) == set(Base.metadata.tables)
