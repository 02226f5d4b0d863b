"""A live API on the bundled model with keys of every role in two tenants, made directly in the database."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from live_api import make_key, migrated_settings, serve_in_thread

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.settings import Settings


@dataclass
class AuthServer:
    url: str
    settings: Settings
    # "admin" (tenant default: the operator), "tenant-admin" / "developer" / "inference" (tenant acme),
    # "other" (tenant umbrella)
    keys: dict[str, str]


@pytest.fixture(scope="module")
def auth_server(model_dir, tmp_path_factory) -> Iterator[AuthServer]:
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    keys = {
        "admin": make_key(settings, tenant="default", role="admin"),
        "tenant-admin": make_key(settings, tenant="acme", role="admin"),
        "developer": make_key(settings, tenant="acme", role="developer"),
        "inference": make_key(settings, tenant="acme", role="inference"),
        "other": make_key(settings, tenant="umbrella", role="developer"),
    }
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64))
    lookup = LocalAdapterLookup({engine.model_name}, {}, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield AuthServer(url=url, settings=settings, keys=keys)


@dataclass
class AccessServer:
    """A server as `loraloom serve` builds it (compose_app), with the app itself
    for walking its routes. keys: "inference", "developer", "admin" (tenant acme), "globex" (a developer
    of tenant globex), "operator" (an admin key of tenant default)."""

    url: str
    app: object
    engine: AsyncEngine
    settings: Settings
    keys: dict[str, str]


@pytest.fixture(scope="session")
def access_server(model_dir, tmp_path_factory) -> Iterator[AccessServer]:
    from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
    from loraloom.platform.api.composition import compose_app
    from loraloom.platform.storage import storage_from_settings

    settings = migrated_settings(tmp_path_factory.mktemp("access"))
    keys = {
        "inference": make_key(settings, tenant="acme", role="inference"),
        "developer": make_key(settings, tenant="acme", role="developer"),
        "admin": make_key(settings, tenant="acme", role="admin"),
        "globex": make_key(settings, tenant="globex", role="developer"),
        "operator": make_key(settings, tenant="default", role="admin"),
    }
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    app = compose_app(settings, engine)
    with serve_in_thread(app) as url:
        yield AccessServer(url=url, app=app, engine=engine, settings=settings, keys=keys)
