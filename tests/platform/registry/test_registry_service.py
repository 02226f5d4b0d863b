"""The registry service forgets its cached resolutions of an adapter after every change it makes, so
the request path's lookup over the same cache sees each change at once: no invalidate call, and no
waiting for the cache's TTL (which this clock never reaches). A deletion unloads the versions from
the engine and deletes the blobs nothing else holds."""
from __future__ import annotations

from pathlib import Path

import pytest
from registry_checks import parts_of, stored_objects

from loraloom.platform.registry.errors import AdapterNotFoundError
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.lookup import RegistryAdapterLookup
from loraloom.platform.registry.resolution import ResolutionCache
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.registry.staging import UploadLimits
from loraloom.platform.training.jobs import find_checkpoint

FROZEN_CLOCK = 0.0  # cached answers never expire: only an invalidation makes a change visible


@pytest.fixture
def registry(file_store, served, tmp_path: Path) -> RegistryService:
    return RegistryService(
        store=file_store, base=served, resolutions=ResolutionCache(capacity=100, ttl_s=30.0, clock=lambda: FROZEN_CLOCK),
        upload_limits=UploadLimits(max_total_bytes=64 * 1024 * 1024), staging_dir=tmp_path, presigned_expires_s=600,
    )


@pytest.fixture
def lookup(registry: RegistryService, session_factory, served) -> RegistryAdapterLookup:
    return RegistryAdapterLookup(
        session_factory=session_factory, store=registry.store, resolutions=registry.resolutions,
        local=LocalAdapterLookup({served.name}, {}, None), find_checkpoint=find_checkpoint,
    )


def push(registry: RegistryService, session_factory, tenant, directory: Path) -> int:
    with session_factory() as session:
        return registry.upload_version(
            session, tenant_id=tenant, name="bot", actor_key_id=None, parts=parts_of(directory)
        ).version.number


def test_pushes_and_alias_changes_are_seen_by_the_next_lookup(
    registry, lookup, session_factory, make_tenant, peft_adapter, other_peft_adapter
):
    tenant = make_tenant(session_factory, "acme")
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("bot", tenant)  # the miss is cached too
    assert push(registry, session_factory, tenant, peft_adapter) == 1
    assert lookup.resolve("bot", tenant).name == "bot@1"

    assert push(registry, session_factory, tenant, other_peft_adapter) == 2
    assert lookup.resolve("bot", tenant).name == "bot@2"

    with session_factory() as session:
        _, handle = registry.move_alias(session, tenant_id=tenant, name="bot", alias="prod", number=1,
                                        actor_key_id=None)
    assert handle == lookup.resolve("bot:prod", tenant)  # what the route prefetches is what requests get
    with session_factory() as session:
        registry.move_alias(session, tenant_id=tenant, name="bot", alias="prod", number=2, actor_key_id=None)
    assert lookup.resolve("bot:prod", tenant).name == "bot@2"

    with session_factory() as session:
        registry.remove_alias(session, tenant_id=tenant, name="bot", alias="prod", actor_key_id=None)
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("bot:prod", tenant)


def test_deletions_are_seen_unloaded_and_their_blobs_collected(
    registry, lookup, session_factory, make_tenant, peft_adapter, other_peft_adapter
):
    tenant = make_tenant(session_factory, "acme")
    push(registry, session_factory, tenant, peft_adapter)
    push(registry, session_factory, tenant, other_peft_adapter)
    first, second = lookup.resolve("bot@1", tenant), lookup.resolve("bot@2", tenant)
    unloaded: list[str] = []

    with session_factory() as session:
        registry.delete_version(session, tenant_id=tenant, name="bot", number=2, force=False, actor_key_id=None,
                                unload=unloaded.append)
    assert unloaded == [second.key]
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("bot@2", tenant)
    assert lookup.resolve("bot", tenant).name == "bot@1"  # latest moved back, and the lookup knows it

    with session_factory() as session:
        registry.delete_adapter(session, tenant_id=tenant, name="bot", force=False, unload=unloaded.append)
    assert unloaded == [second.key, first.key]
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("bot", tenant)
    assert stored_objects(registry.store) == []
