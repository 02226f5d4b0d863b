"""Issue 12, item 9: a server killed mid-upload (kill -9) left `loraloom-upload-*` staging folders in
the system temp dir and `blobs/tmp/*.part` files in the data dir for ever. Staging now lives under
the data dir, and a starting server removes the leftovers older than the grace period, keeping
younger ones, which may belong to another live server sharing the data dir."""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

from live_api import new_tenant
from registry_checks import parts_of

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database
from loraloom.platform.registry.service import RegistryService, registry_service_from_settings
from loraloom.platform.registry.staging import UploadedPart
from loraloom.platform.registry.validation import ServedBase
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings

HOUR_S = 3600.0


def age(path: Path, seconds: float) -> Path:
    """Set the mtime of `path` and everything under it to `seconds` ago."""
    then = time.time() - seconds
    for entry in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(entry, (then, then))
    return path


def staging_folder(parent: Path, name: str, content: bytes = b"x" * 1024) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / ADAPTER_WEIGHTS_FILE).write_bytes(content)
    return folder


def part_file(parent: Path, name: str) -> Path:
    path = parent / name
    path.write_bytes(b"partial blob")
    return path


def start_server_registry(settings: Settings, served: ServedBase) -> RegistryService:
    """What `loraloom serve` does as it starts, up to the registry (the engine is not needed here)."""
    return registry_service_from_settings(settings, storage_from_settings(settings), served)


def test_start_removes_stale_upload_leftovers_and_keeps_fresh_ones(tmp_path: Path, served) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    staging, part_dir, cache = settings.staging_dir, settings.data_dir / "blobs" / "tmp", settings.adapter_cache_dir
    part_dir.mkdir(parents=True)
    cache.mkdir(parents=True)
    stale = [
        age(staging_folder(staging, "loraloom-upload-killed"), 2 * HOUR_S),
        age(part_file(part_dir, "tmpkilled.part"), 2 * HOUR_S),
        age(staging_folder(cache, ".partial-killed"), 2 * HOUR_S),
    ]
    in_use = age(staging_folder(staging, "loraloom-upload-slow"), 2 * HOUR_S)
    (in_use / ADAPTER_CONFIG_FILE).write_bytes(b"{}")  # another server is writing into it right now
    fresh = [
        staging_folder(staging, "loraloom-upload-live"),
        part_file(part_dir, "tmplive.part"),
        staging_folder(cache, ".partial-live"),
        in_use,
        age(staging_folder(cache, "0123-4567"), 2 * HOUR_S),  # a finished cached version, not a leftover
    ]

    start_server_registry(settings, served)

    assert [path for path in stale if path.exists()] == []
    assert [path for path in fresh if not path.exists()] == []


def test_the_grace_period_is_a_setting(tmp_path: Path, served) -> None:
    settings = Settings(data_dir=tmp_path / "data", stale_file_grace_s=60)
    older = age(staging_folder(settings.staging_dir, "loraloom-upload-older"), 120)
    younger = age(staging_folder(settings.staging_dir, "loraloom-upload-younger"), 10)
    start_server_registry(settings, served)
    assert (older.exists(), younger.exists()) == (False, True)


class WatchingStream(io.BytesIO):
    """The upload's bytes, noting which staging folders exist while the server reads them."""

    def __init__(self, data: bytes, staging_dir: Path) -> None:
        super().__init__(data)
        self.staging_dir = staging_dir
        self.seen: list[str] = []

    def read(self, size: int | None = -1) -> bytes:
        self.seen += [entry.name for entry in self.staging_dir.iterdir()]
        return super().read(size)


def test_uploads_are_staged_under_the_data_dir(tmp_path: Path, peft_adapter: Path, served) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    upgrade_database(settings.database_url)
    registry = start_server_registry(settings, served)
    assert registry.staging_dir == settings.data_dir / "staging"
    config, weights = parts_of(peft_adapter)
    watched = WatchingStream(weights.stream.read(), settings.staging_dir)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            tenant = new_tenant(session)
            version = registry.upload_version(
                session, tenant_id=tenant.id, name="bot", actor_key_id=None,
                parts=[config, UploadedPart(ADAPTER_WEIGHTS_FILE, watched)],
            ).version
    finally:
        engine.dispose()
    assert version.number == 1
    assert watched.seen and all(name.startswith("loraloom-upload-") for name in watched.seen)
    assert list(settings.staging_dir.iterdir()) == []  # removed once the upload is over
