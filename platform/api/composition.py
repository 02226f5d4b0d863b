"""compose_app: the serving app over an engine, put together the one way both `loraloom serve` and
the Ray Serve gateway deployment use: the blob store, the adapter registry (registry/service.py),
the lookup that resolves adapter names through the registry's cache and then the server-local
adapters, and create_app over them."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from loraloom.engine import EngineClient
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.lookup import registry_lookup
from loraloom.platform.registry.service import registry_service_from_settings
from loraloom.platform.registry.validation import ServedBase
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.jobs import find_checkpoint
from loraloom.platform.training.supervisor import TrainingSupervisor


def compose_app(
    settings: Settings,
    engine: EngineClient,
    *,
    adapters: dict[str, Path] | None = None,
    adapter_dir: Path | None = None,
    training: TrainingSupervisor | None = None,
) -> FastAPI:
    """The app serving `engine` with the registry in `settings` (its database, migrated, and storage).
    `adapters` (NAME -> directory) and the subdirectories of `adapter_dir` are served to every tenant
    besides its own registry (serve's --adapter and --adapter-dir). Raises ValueError for an adapter
    named like the base. Called once as a server starts: it removes the upload leftovers of killed servers."""
    local = LocalAdapterLookup(base_names={engine.model_name}, adapters=adapters or {}, adapter_dir=adapter_dir)
    registry = registry_service_from_settings(settings, storage_from_settings(settings), ServedBase.of(engine))
    lookup = registry_lookup(registry, settings.database_url, local, find_checkpoint=find_checkpoint)
    return create_app(engine, lookup, settings, registry=registry, training=training)
