"""A live app with a registry (SQLite, file:// blobs) on the bundled model, server-local adapters from a
folder, and a developer key of tenant acme: what the tests of an adapter's own files (its chat template,
its tool parser) push to and chat with."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from live_api import bearer, make_key, migrated_settings

from loraloom.engine import ADAPTER_FILES
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings


@dataclass
class LiveRegistry:
    client: TestClient
    engine: AsyncEngine
    acme: dict[str, str]

    def push(self, name: str, directory: Path, extra: dict[str, bytes] | None = None):
        files = [("files", (file, (directory / file).read_bytes(), "application/octet-stream"))
                 for file in ADAPTER_FILES]
        files += [("files", (file, data, "application/octet-stream")) for file, data in (extra or {}).items()]
        return self.client.post(f"/v1/adapters/{name}/versions", files=files, headers=self.acme)

    def chat_prompt_tokens(self, model: str, messages: list[dict[str, Any]], **fields: Any) -> int:
        """The prompt tokens of a one-token greedy chat: what the engine counts is the prompt it rendered."""
        response = self.client.post("/v1/chat/completions", headers=self.acme, json={
            "model": model, "messages": messages, "max_tokens": 1, "temperature": 0, **fields})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]


@contextmanager
def live_registry(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, adapter_dir: Path,
                  **settings_fields: Any) -> Iterator[LiveRegistry]:
    settings = migrated_settings(tmp_path_factory.mktemp("server"))
    for field, value in settings_fields.items():
        setattr(settings, field, value)
    acme = make_key(settings, tenant="acme", role="developer")
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    with TestClient(compose_app(settings, engine, adapter_dir=adapter_dir)) as client:
        yield LiveRegistry(client, engine, bearer(acme))
