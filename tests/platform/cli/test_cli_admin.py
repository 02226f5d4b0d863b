"""`loraloom db upgrade` and `loraloom admin create-key` run as real commands on SQLite and
PostgreSQL; the printed key works against a live server. The bootstrap admin key of
`loraloom serve` is made on the first start only."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
from live_api import bearer, serve_in_thread
from sqlalchemy import select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.cli.admin import prepare_database
from loraloom.platform.db import create_db_engine, create_session_factory, database_revision
from loraloom.platform.db.api_keys import hash_api_key
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.settings import Settings

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script
KEY_LINE = re.compile(r"ll-[A-Za-z0-9_-]{40,}\n")


def loraloom(args: list[str], database_url: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LORALOOM_DATABASE_URL": database_url, "LORALOOM_DATA_DIR": str(data_dir)}
    return subprocess.run([str(LORALOOM), *args], env=env, capture_output=True, text=True, timeout=120)


def stored_key(database_url: str, plaintext: str) -> tuple[ApiKey, str]:
    engine = create_db_engine(database_url)
    try:
        with create_session_factory(engine)() as session:
            key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_api_key(plaintext)))
            return key, key.tenant.name
    finally:
        engine.dispose()


def test_create_key_prints_only_the_key_and_it_works_against_a_live_server(database_url, tmp_path, model_dir):
    refused = loraloom(["admin", "create-key", "--tenant", "acme", "--role", "developer"], database_url, tmp_path)
    assert refused.returncode != 0 and refused.stdout == ""
    assert "loraloom db upgrade" in refused.stderr  # an empty database: say how to fix it

    upgraded = loraloom(["db", "upgrade"], database_url, tmp_path)
    assert upgraded.returncode == 0 and upgraded.stdout == "", upgraded.stderr
    revision = database_revision(database_url)
    assert revision is not None and f"revision {revision}" in upgraded.stderr

    created = loraloom(["admin", "create-key", "--tenant", "acme", "--role", "developer"], database_url, tmp_path)
    assert created.returncode == 0, created.stderr
    assert KEY_LINE.fullmatch(created.stdout), created.stdout  # the key and nothing else
    key = created.stdout.strip()
    row, tenant = stored_key(database_url, key)
    assert (tenant, row.role, row.revoked_at) == ("acme", ApiKeyRole.developer, None)

    # The tenant exists now: a second key joins it.
    second = loraloom(["admin", "create-key", "--tenant", "acme", "--role", "inference", "--name", "app"],
                      database_url, tmp_path)
    assert second.returncode == 0 and stored_key(database_url, second.stdout.strip())[1] == "acme"

    settings = Settings(data_dir=tmp_path, database_url=database_url)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=16))
    with serve_in_thread(create_app(engine, LocalAdapterLookup({engine.model_name}, {}, None), settings)) as url:
        listed = httpx.get(f"{url}/v1/keys", headers=bearer(key), timeout=60)
        assert listed.status_code == 200, listed.text
        assert {k["prefix"] for k in listed.json()["data"]} == {key[:11], second.stdout[:11]}
        assert httpx.get(f"{url}/v1/keys", headers=bearer(second.stdout.strip()), timeout=60).status_code == 403


def test_create_key_refuses_a_bad_tenant_name(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'loraloom.db'}"
    assert loraloom(["db", "upgrade"], database_url, tmp_path).returncode == 0
    refused = loraloom(["admin", "create-key", "--tenant", "Bad Name", "--role", "admin"], database_url, tmp_path)
    assert refused.returncode != 0 and refused.stdout == ""
    assert "'Bad Name' is not a valid tenant name" in refused.stderr


def test_bootstrap_admin_key_is_made_and_printed_on_the_first_start_only(database_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    first = io.StringIO()
    prepare_database(settings, first)  # an empty database: migrated, then bootstrapped
    keys = re.findall(r"ll-[A-Za-z0-9_-]{40,}", first.getvalue())
    assert len(keys) == 1 and "shown this once" in first.getvalue()
    row, tenant = stored_key(database_url, keys[0])
    assert (tenant, row.role) == ("default", ApiKeyRole.admin)

    second = io.StringIO()
    prepare_database(settings, second)
    assert second.getvalue() == ""
    engine = create_db_engine(database_url)
    try:
        with create_session_factory(engine)() as session:
            assert session.scalar(select(ApiKey.id).where(ApiKey.role == ApiKeyRole.admin)) == row.id
            assert list(session.scalars(select(Tenant.name))) == ["default"]
    finally:
        engine.dispose()


def test_no_bootstrap_key_when_an_admin_key_was_made_first(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'loraloom.db'}"
    assert loraloom(["db", "upgrade"], database_url, tmp_path).returncode == 0
    made = loraloom(["admin", "create-key", "--tenant", "ops", "--role", "admin"], database_url, tmp_path)
    assert made.returncode == 0
    banner = io.StringIO()
    prepare_database(Settings(data_dir=tmp_path, database_url=database_url), banner)
    assert banner.getvalue() == ""
