"""One live server for the issue-3 acceptance tests: uvicorn on a free port, the bundled model,
the adapter registry on SQLite and file:// storage, keys for two tenants, and two real PEFT
adapters for the bundled model made with different seeds."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter
from sqlalchemy import Engine, func, select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.db import create_db_engine
from loraloom.platform.db.models import AuditLogEntry, Base, BlobLock, UsageRecord
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import LocalBlobStore, storage_from_settings

MAX_LORA_RANK = 8  # small, so a rank-16 config is "too large" without a big file
UPLOAD_LIMIT_BYTES = 4 * 1024 * 1024  # both adapters are well under it
# Written off the request path by every call; and the per-blob lock rows a claim or a collection
# leaves (db/blob_references.py: they stay on purpose, and say nothing). The corpus compares the rest.
UNCOMPARED_TABLES = {AuditLogEntry.__tablename__, UsageRecord.__tablename__, BlobLock.__tablename__}


@dataclass(frozen=True)
class State:
    """Everything a refused request must leave as it was."""

    row_counts: dict[str, int]
    blobs: list[str]


@dataclass
class Live:
    url: str
    keys: dict[str, str]  # acme-developer, acme-inference, globex-developer
    adapters: dict[str, Path]  # v1, v2: different seeds, same targets
    store: LocalBlobStore
    database: Engine
    max_lora_rank: int = MAX_LORA_RANK
    upload_limit_bytes: int = UPLOAD_LIMIT_BYTES

    def http(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.keys[key]), timeout=120)

    def state(self) -> State:
        with self.database.connect() as connection:
            counts = {
                table.name: connection.scalar(select(func.count()).select_from(table))
                for table in Base.metadata.sorted_tables
                if table.name not in UNCOMPARED_TABLES
            }
        blobs = sorted(str(p.relative_to(self.store.root)) for p in self.store.root.rglob("*") if p.is_file())
        return State(row_counts=counts, blobs=blobs)


@pytest.fixture(scope="package")
def live(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("acceptance-adapters")
    adapters = {
        f"v{n}": make_peft_adapter(model_dir, root / f"v{n}", rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=seed)
        for n, seed in ((1, 41), (2, 42))
    }
    settings = migrated_settings(tmp_path_factory.mktemp("acceptance-data")).model_copy(
        update={"adapter_upload_max_bytes": UPLOAD_LIMIT_BYTES}
    )
    keys = {
        "acme-developer": make_key(settings, tenant="acme", role="developer"),
        "acme-inference": make_key(settings, tenant="acme", role="inference"),
        "globex-developer": make_key(settings, tenant="globex", role="developer"),
    }
    store = storage_from_settings(settings)
    assert isinstance(store, LocalBlobStore)
    engine = AsyncEngine.create(
        model_dir,
        EngineConfig(num_kv_blocks=64, max_lora_rank=MAX_LORA_RANK),
        adapter_fetcher_from_settings(settings, store),
    )
    app = compose_app(settings, engine)
    database = create_db_engine(settings.database_url)
    try:
        with serve_in_thread(app) as url:
            yield Live(url=url, keys=keys, adapters=adapters, store=store, database=database)
    finally:
        database.dispose()
