"""`loraloom db upgrade` and `loraloom admin create-key` run as real commands on SQLite and
PostgreSQL; the printed key works against a live server. The bootstrap admin key of
`loraloom serve` is made on the first start only, into a file only its user can read."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
from live_api import bearer, serve_in_thread
from sqlalchemy import select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.cli.admin import bootstrap_notice, prepare_database
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


def test_bootstrap_admin_key_is_made_and_written_to_a_private_file_on_the_first_start_only(database_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    key_file = prepare_database(settings)  # an empty database: migrated, then bootstrapped
    assert key_file == tmp_path / "bootstrap-admin-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # this user's alone
    assert KEY_LINE.fullmatch(key_file.read_text())  # the key and nothing else
    row, tenant = stored_key(database_url, key_file.read_text().strip())
    assert (tenant, row.role) == ("default", ApiKeyRole.admin)
    notice = bootstrap_notice(key_file)
    assert str(key_file) in notice and key_file.read_text().strip() not in notice  # the path, never the key

    key_file.unlink()  # as the operator is told to, once the key is kept elsewhere
    assert prepare_database(settings) is None
    assert not key_file.exists()  # no second key
    engine = create_db_engine(database_url)
    try:
        with create_session_factory(engine)() as session:
            assert session.scalar(select(ApiKey.id).where(ApiKey.role == ApiKeyRole.admin)) == row.id
            assert list(session.scalars(select(Tenant.name))) == ["default"]
    finally:
        engine.dispose()


def test_a_stale_key_file_is_replaced_and_made_private(tmp_path):
    stale = tmp_path / "bootstrap-admin-key"
    stale.write_text("ll-from-an-older-database\n")
    stale.chmod(0o644)
    key_file = prepare_database(Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'loraloom.db'}"))
    assert key_file == stale and stat.S_IMODE(stale.stat().st_mode) == 0o600
    assert KEY_LINE.fullmatch(stale.read_text())


def test_no_bootstrap_key_when_an_admin_key_was_made_first(tmp_path):
    database_url = f"sqlite:///{tmp_path / 'loraloom.db'}"
    assert loraloom(["db", "upgrade"], database_url, tmp_path).returncode == 0
    made = loraloom(["admin", "create-key", "--tenant", "ops", "--role", "admin"], database_url, tmp_path)
    assert made.returncode == 0
    assert prepare_database(Settings(data_dir=tmp_path, database_url=database_url)) is None
    assert not (tmp_path / "bootstrap-admin-key").exists()
