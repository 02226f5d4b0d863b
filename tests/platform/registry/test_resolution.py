"""name / name:alias / name@N -> an immutable version's handle, per tenant, through the cache;
server-local adapters as the fallback for bare names."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from registry_checks import upload_dir
from sqlalchemy import event

from loraloom.engine.lora.files import runtime_key
from loraloom.platform.registry.aliases import move_alias
from loraloom.platform.registry.errors import AdapterNotFoundError
from loraloom.platform.registry.fetch import version_uri
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.lookup import RegistryAdapterLookup
from loraloom.platform.registry.references import parse_reference
from loraloom.platform.registry.resolution import ResolutionCache
from loraloom.platform.registry.versions import delete_version
from loraloom.platform.training.jobs import find_checkpoint


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def local_adapter(peft_adapter: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(peft_adapter, tmp_path / "local" / "shared-local"))


@pytest.fixture
def lookup(session_factory, file_store, served, clock, local_adapter) -> RegistryAdapterLookup:
    local = LocalAdapterLookup({served.name}, {}, local_adapter.parent)
    return RegistryAdapterLookup(
        session_factory=session_factory, store=file_store,
        resolutions=ResolutionCache(capacity=100, ttl_s=30.0, clock=clock), local=local,
        find_checkpoint=find_checkpoint,
    )


@pytest.fixture
def queries(session_factory) -> list[str]:
    """Every SQL statement the database sees from here on."""
    statements: list[str] = []
    event.listen(session_factory.kw["bind"], "before_cursor_execute", lambda *args: statements.append(args[2]))
    return statements


@pytest.fixture
def acme_versions(lookup, session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter):
    """Tenant acme with support-bot versions 1 (= prod) and 2 (= latest)."""
    tenant = make_tenant(session_factory, "acme")
    versions = [upload_dir(session_factory, file_store, served, tenant, d) for d in (peft_adapter, other_peft_adapter)]
    with session_factory() as session:
        move_alias(session, tenant_id=tenant, name="support-bot", alias="prod", number=1, actor_key_id=None)
    return tenant, versions


def weights_sha(version) -> str:
    return next(f.sha256 for f in version.files if f.filename == "adapter_model.safetensors")


def config_sha(version) -> str:
    return next(f.sha256 for f in version.files if f.filename == "adapter_config.json")


@pytest.mark.parametrize(
    "model, number", [("support-bot", 2), ("support-bot:latest", 2), ("support-bot:prod", 1), ("support-bot@1", 1)]
)
def test_references_resolve_to_immutable_version_handles(lookup, acme_versions, file_store, model, number):
    tenant, versions = acme_versions
    version = versions[number - 1]
    handle = lookup.resolve(model, tenant)
    sha = weights_sha(version)
    assert handle.key == runtime_key(sha, config_sha(version), tenant)
    assert handle.name == f"support-bot@{number}"
    assert handle.sha256 == sha
    assert handle.uri == version_uri(file_store, weights_sha256=sha, config_sha256=config_sha(version))


def test_same_weights_in_two_tenants_get_different_runtime_keys(
    lookup, acme_versions, session_factory, file_store, served, make_tenant, peft_adapter
):
    acme, _ = acme_versions
    globex = make_tenant(session_factory, "globex")
    upload_dir(session_factory, file_store, served, globex, peft_adapter)
    ours, theirs = lookup.resolve("support-bot@1", acme), lookup.resolve("support-bot@1", globex)
    assert ours.sha256 == theirs.sha256 and ours.uri == theirs.uri
    assert ours.key != theirs.key  # the key salts prefix-cache hashes: tenants never share KV


@pytest.mark.parametrize("model", ["support-bot", "support-bot:prod", "support-bot@1", "support-bot@9", "nope:prod"])
def test_another_tenants_adapter_is_a_404_like_a_missing_one(lookup, acme_versions, session_factory, make_tenant, model):
    globex = make_tenant(session_factory, "globex")
    with pytest.raises(AdapterNotFoundError) as raised:
        lookup.resolve(model, globex)
    assert raised.value.name == model
    assert str(raised.value) == str(AdapterNotFoundError(model))


def test_base_names_and_server_local_adapters(lookup, acme_versions, served, local_adapter):
    tenant, _ = acme_versions
    for name in ("base", "", served.name):
        assert lookup.resolve(name, tenant) is None
    local = lookup.resolve("shared-local", tenant)
    assert local.uri == local_adapter.resolve().as_uri()  # every tenant sees server-local adapters
    assert lookup.resolve("shared-local", None).key == local.key
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("shared-local:prod", tenant)  # aliases exist only in the registry
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("support-bot", None)  # no tenant: the registry is not consulted


def test_registry_name_wins_over_a_server_local_adapter(
    lookup, acme_versions, session_factory, file_store, served, other_peft_adapter
):
    tenant, _ = acme_versions
    upload_dir(session_factory, file_store, served, tenant, other_peft_adapter, name="shared-local")
    assert lookup.resolve("shared-local", tenant).key.startswith(f"{tenant}/")


def test_deleted_version_no_longer_resolves(lookup, acme_versions, session_factory):
    tenant, _ = acme_versions
    with session_factory() as session:
        delete_version(session, tenant_id=tenant, name="support-bot", number=2, force=False, actor_key_id=None)
    lookup.resolutions.invalidate(tenant, "support-bot")
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("support-bot@2", tenant)
    assert lookup.resolve("support-bot", tenant).name == "support-bot@1"  # latest moved back


def test_cache_serves_repeats_without_the_database_and_invalidates_on_alias_moves(
    lookup, acme_versions, session_factory, queries, clock
):
    tenant, _ = acme_versions
    assert lookup.resolve("support-bot:prod", tenant).name == "support-bot@1"
    queries.clear()
    for _ in range(5):
        assert lookup.resolve("support-bot:prod", tenant).name == "support-bot@1"
    assert queries == []  # the hot path does not touch the database

    with session_factory() as session:
        move_alias(session, tenant_id=tenant, name="support-bot", alias="prod", number=2, actor_key_id=None)
    # Moved behind the cache's back: still the cached answer until invalidated (or the TTL ends).
    assert lookup.resolve("support-bot:prod", tenant).name == "support-bot@1"
    lookup.resolutions.invalidate(tenant, "support-bot")
    assert lookup.resolve("support-bot:prod", tenant).name == "support-bot@2"

    with session_factory() as session:
        move_alias(session, tenant_id=tenant, name="support-bot", alias="prod", number=1, actor_key_id=None)
    clock.now += 31.0  # past the TTL: another gateway's move is seen without an invalidation
    assert lookup.resolve("support-bot:prod", tenant).name == "support-bot@1"


def test_misses_are_cached_too_and_invalidated_by_a_first_upload(
    lookup, session_factory, file_store, served, make_tenant, peft_adapter, queries
):
    tenant = make_tenant(session_factory, "acme")
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("newcomer", tenant)
    queries.clear()
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("newcomer", tenant)
    assert queries == []
    upload_dir(session_factory, file_store, served, tenant, peft_adapter, name="newcomer")
    lookup.resolutions.invalidate(tenant, "newcomer")
    assert lookup.resolve("newcomer", tenant).name == "newcomer@1"


def test_list_adapters_gives_the_tenants_latest_versions_then_local_ones(lookup, acme_versions, session_factory, make_tenant):
    tenant, _ = acme_versions
    assert [h.name for h in lookup.list_adapters(tenant)] == ["support-bot@2", "shared-local"]
    globex = make_tenant(session_factory, "globex")
    assert [h.name for h in lookup.list_adapters(globex)] == ["shared-local"]
    assert [h.name for h in lookup.list_adapters(None)] == ["shared-local"]


def test_an_answer_loaded_during_an_invalidation_is_not_kept():
    cache = ResolutionCache(capacity=10, ttl_s=60.0)
    tenant, reference = uuid.uuid4(), parse_reference("bot:prod")
    loads = []

    def stale_load():
        loads.append("load")
        cache.invalidate(tenant, "bot")  # an alias move commits while this answer is on its way
        return None

    cache.get_or_load(tenant, reference, stale_load)
    cache.get_or_load(tenant, reference, lambda: loads.append("reload"))
    assert loads == ["load", "reload"]


def test_cache_is_bounded_lru():
    cache = ResolutionCache(capacity=2, ttl_s=60.0)
    tenant = uuid.uuid4()
    for name in ("a", "b", "a", "c"):  # "a" used again, so "b" is the least recent when "c" comes
        cache.get_or_load(tenant, parse_reference(name), lambda: None)
    assert len(cache) == 2
    reloaded = []
    cache.get_or_load(tenant, parse_reference("a"), lambda: reloaded.append("a"))
    cache.get_or_load(tenant, parse_reference("b"), lambda: reloaded.append("b"))
    assert reloaded == ["b"]
