"""A live API (module-scoped fixture in conftest.py) on the bundled model for the rate-limit tests, and helpers to give a fresh tenant its
limits directly in the database (the admin API and CLI have tests of their own)."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from live_api import make_key, migrated_settings, serve_in_thread

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.api_keys import hash_api_key
from loraloom.platform.db.models import ApiKey, Tenant
from loraloom.platform.limits.policy import Limits, set_key_limits, set_tenant_limits
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.settings import Settings


@dataclass
class LimitsServer:
    url: str
    settings: Settings
    app: object
    operator_key: str

    def tenant_key(self, tenant_limits: Limits | None = None, key_limits: Limits | None = None,
                   role: str = "inference") -> tuple[str, str]:
        """A key of a new tenant (name, key), with the limits given set on the tenant and on the key."""
        name = f"t-{uuid.uuid4().hex[:8]}"
        key = make_key(self.settings, tenant=name, role=role)
        set_limits(self.settings, name, key, tenant_limits, key_limits)
        return name, key


def set_limits(settings: Settings, tenant: str, key: str, tenant_limits: Limits | None,
               key_limits: Limits | None) -> None:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            tenant_row = session.query(Tenant).filter_by(name=tenant).one()
            key_row = session.query(ApiKey).filter_by(key_hash=hash_api_key(key)).one()
            if tenant_limits is not None:
                set_tenant_limits(session, tenant_id=tenant_row.id, limits=tenant_limits)
            if key_limits is not None:
                set_key_limits(session, key_id=key_row.id, limits=key_limits)
    finally:
        engine.dispose()


def serve_limits(model_dir, data_dir, **settings_fields) -> Iterator[LimitsServer]:
    settings = migrated_settings(data_dir)
    settings = settings.model_copy(update=settings_fields)
    operator = make_key(settings, tenant="default", role="admin")
    # One request runs at a time, and a long one runs for a thousand steps: while it does, the others
    # a test sends wait in the engine (the full-server test) or are refused before it (the concurrency one).
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=160, max_num_seqs=1))
    app = create_app(engine, LocalAdapterLookup({engine.model_name}, {}, None), settings)
    with serve_in_thread(app) as url:
        # A fresh engine's first forward pass takes far longer than the ones after (on busy shared cores,
        # minutes): take it here, unlimited, so the tests' own requests are not the first.
        warm = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {operator}"},
                          json={"model": "base", "prompt": "Hi", "max_tokens": 1}, timeout=600)
        assert warm.status_code == 200, warm.text
        yield LimitsServer(url=url, settings=settings, app=app, operator_key=operator)



LONG_MAX_TOKENS = 2000  # a generation that runs while a test sends its other requests


@contextmanager
def long_stream(server: LimitsServer, key: str) -> Iterator[httpx.Response]:
    """A streamed completion generating for a long time; its first event has arrived. Leaving the block
    disconnects it (the server aborts it)."""
    with httpx.stream("POST", f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      timeout=120, json={"model": "base", "prompt": "Once upon a time", "max_tokens": LONG_MAX_TOKENS,
                                         "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        # Held until the block ends: closing a half-read line iterator closes the connection.
        lines = response.iter_lines()
        while not next(lines).startswith("data:"):
            pass
        yield response
        lines.close()
