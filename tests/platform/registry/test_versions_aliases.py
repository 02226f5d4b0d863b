"""Versions and aliases through the services, on SQLite and PostgreSQL: numbering, `latest`
following uploads, other aliases moving only when told, history, guarded deletes, blob
collection, and tenants that cannot see each other's adapters."""
from __future__ import annotations

from pathlib import Path

import pytest
from registry_checks import registry_row_counts, stored_objects, upload_dir, with_alpha
from sqlalchemy import select

from loraloom.platform.db.models import AdapterVersion, AdapterVersionStatus, Alias
from loraloom.platform.registry.aliases import alias_history, find_alias, move_alias, remove_alias
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.versions import (
    delete_adapter,
    delete_unreferenced_blobs,
    delete_version,
    find_adapter,
    find_version,
    list_adapters,
    list_versions,
)
from loraloom.platform.storage import content_key


@pytest.fixture
def variant(peft_adapter: Path, tmp_path: Path) -> Path:
    """A third distinct version that shares its weights blob with the first."""
    return with_alpha(peft_adapter, tmp_path, alpha=32)


def aliases_of(factory, tenant, name="support-bot") -> dict[str, int]:
    with factory() as session:
        adapter = find_adapter(session, tenant_id=tenant, name=name)
        return {alias.name: alias.version.number for alias in adapter.aliases}


def move(factory, tenant, alias, number, name="support-bot", actor=None):
    with factory() as session:
        return move_alias(session, tenant_id=tenant, name=name, alias=alias, number=number, actor_key_id=actor)


def history(factory, tenant, alias, name="support-bot"):
    with factory() as session:
        return [(m.from_version, m.to_version) for m in alias_history(session, tenant_id=tenant, name=name, alias=alias)]


def test_versions_count_up_and_only_latest_moves_by_itself(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter, variant
):
    tenant = make_tenant(session_factory, "acme")
    assert upload_dir(session_factory, file_store, served, tenant, peft_adapter).number == 1
    assert aliases_of(session_factory, tenant) == {"latest": 1}
    assert upload_dir(session_factory, file_store, served, tenant, other_peft_adapter).number == 2
    move(session_factory, tenant, "prod", 1)
    assert aliases_of(session_factory, tenant) == {"latest": 2, "prod": 1}
    assert upload_dir(session_factory, file_store, served, tenant, variant).number == 3
    assert aliases_of(session_factory, tenant) == {"latest": 3, "prod": 1}
    with session_factory() as session:
        page = list_versions(session, tenant_id=tenant, name="support-bot", limit=2, after=None)
        assert [v.number for v in page.items] == [1, 2] and page.has_more
        page = list_versions(session, tenant_id=tenant, name="support-bot", limit=2, after=2)
        assert [v.number for v in page.items] == [3] and not page.has_more


def test_promote_and_rollback_are_recorded_in_history(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter
):
    tenant = make_tenant(session_factory, "acme")
    upload_dir(session_factory, file_store, served, tenant, peft_adapter)
    upload_dir(session_factory, file_store, served, tenant, other_peft_adapter)
    actor = None
    move(session_factory, tenant, "prod", 1, actor=actor)  # created
    move(session_factory, tenant, "prod", 2)  # promote
    move(session_factory, tenant, "prod", 2)  # already there: no history
    move(session_factory, tenant, "prod", 1)  # rollback
    assert history(session_factory, tenant, "prod") == [(None, 1), (1, 2), (2, 1)]
    assert history(session_factory, tenant, "latest") == [(None, 1), (1, 2)]
    with session_factory() as session:
        remove_alias(session, tenant_id=tenant, name="support-bot", alias="prod", actor_key_id=None)
    assert history(session_factory, tenant, "prod")[-1] == (1, None)
    with pytest.raises(RegistryNotFoundError, match="has no alias 'prod'"):
        with session_factory() as session:
            find_alias(session, tenant_id=tenant, name="support-bot", alias="prod")


@pytest.mark.parametrize(
    "alias, number, error, message",
    [
        ("latest", 1, ValueError, "alias: 'latest' always names the newest version"),
        ("Prod:x", 1, ValueError, "alias: 'Prod:x' is not a valid alias name"),
        ("prod", 7, RegistryNotFoundError, "has no version 7"),
    ],
)
def test_bad_alias_moves_are_refused(session_factory, file_store, served, make_tenant, peft_adapter, alias, number, error, message):
    tenant = make_tenant(session_factory, "acme")
    upload_dir(session_factory, file_store, served, tenant, peft_adapter)
    with pytest.raises(error, match=message):
        move(session_factory, tenant, alias, number)
    assert aliases_of(session_factory, tenant) == {"latest": 1}


def test_deleting_an_aliased_version_needs_force(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter, variant
):
    tenant = make_tenant(session_factory, "acme")
    first = upload_dir(session_factory, file_store, served, tenant, peft_adapter)
    upload_dir(session_factory, file_store, served, tenant, other_peft_adapter)
    upload_dir(session_factory, file_store, served, tenant, variant)  # shares version 1's weights
    move(session_factory, tenant, "prod", 1)
    move(session_factory, tenant, "staging", 1)

    def delete(force: bool):
        with session_factory() as session:
            removed = delete_version(session, tenant_id=tenant, name="support-bot", number=1, force=force, actor_key_id=None)
            return removed, delete_unreferenced_blobs(session, store=file_store, versions=[removed])

    with pytest.raises(RegistryConflictError, match="alias\\(es\\) prod, staging point at"):
        delete(force=False)
    assert aliases_of(session_factory, tenant) == {"latest": 3, "prod": 1, "staging": 1}

    removed, collected = delete(force=True)
    assert removed.number == 1
    files = {f.filename: f.sha256 for f in first.files}
    # Its config blob is gone; its weights blob stays, version 3 still uses it.
    assert collected == [files["adapter_config.json"]]
    assert not file_store.exists(content_key(files["adapter_config.json"]))
    assert file_store.exists(content_key(files["adapter_model.safetensors"]))
    assert aliases_of(session_factory, tenant) == {"latest": 3}
    assert history(session_factory, tenant, "prod") == [(None, 1), (1, None)]
    with session_factory() as session:
        with pytest.raises(RegistryNotFoundError, match="has no version 1"):
            find_version(session, tenant_id=tenant, name="support-bot", number=1)
        assert [v.number for v in list_versions(session, tenant_id=tenant, name="support-bot", limit=10, after=None).items] == [2, 3]
        # The row stays (history names it), marked deleted.
        assert session.scalar(select(AdapterVersion.status).where(AdapterVersion.number == 1)) == AdapterVersionStatus.deleted


def test_deleting_the_newest_version_moves_latest_back_and_numbers_are_not_reused(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter, variant
):
    tenant = make_tenant(session_factory, "acme")
    upload_dir(session_factory, file_store, served, tenant, peft_adapter)
    upload_dir(session_factory, file_store, served, tenant, other_peft_adapter)
    with session_factory() as session:
        delete_version(session, tenant_id=tenant, name="support-bot", number=2, force=False, actor_key_id=None)
    assert aliases_of(session_factory, tenant) == {"latest": 1}
    assert upload_dir(session_factory, file_store, served, tenant, variant).number == 3
    assert history(session_factory, tenant, "latest") == [(None, 1), (1, 2), (2, 1), (1, 3)]
    with session_factory() as session:
        delete_version(session, tenant_id=tenant, name="support-bot", number=3, force=False, actor_key_id=None)
        delete_version(session, tenant_id=tenant, name="support-bot", number=1, force=False, actor_key_id=None)
    assert aliases_of(session_factory, tenant) == {}  # nothing left for latest to name


def test_deleting_an_adapter_removes_rows_and_unshared_blobs(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter
):
    acme, globex = make_tenant(session_factory, "acme"), make_tenant(session_factory, "globex")
    upload_dir(session_factory, file_store, served, acme, peft_adapter)
    upload_dir(session_factory, file_store, served, acme, other_peft_adapter)
    move(session_factory, acme, "prod", 1)
    upload_dir(session_factory, file_store, served, globex, peft_adapter)  # same bytes, another tenant
    shared = set(stored_objects(file_store))
    with session_factory() as session:
        with pytest.raises(RegistryConflictError, match="alias.*prod.*force=true"):
            delete_adapter(session, tenant_id=acme, name="support-bot", force=False)
    assert registry_row_counts(session_factory)["adapter_versions"] == 3  # refused: nothing went
    with session_factory() as session:
        removed = delete_adapter(session, tenant_id=acme, name="support-bot", force=True)
        delete_unreferenced_blobs(session, store=file_store, versions=removed)
    assert sorted(v.number for v in removed) == [1, 2]
    counts = registry_row_counts(session_factory)
    assert counts == {"adapters": 1, "adapter_versions": 1, "adapter_version_files": 2, "aliases": 1, "alias_history": 1}
    remaining = set(stored_objects(file_store))
    assert len(remaining) == 2 and remaining < shared  # globex's blobs stay, version 2's went
    with session_factory() as session:
        with pytest.raises(RegistryNotFoundError):
            find_adapter(session, tenant_id=acme, name="support-bot")
        assert find_adapter(session, tenant_id=globex, name="support-bot").name == "support-bot"


def test_another_tenants_adapter_is_indistinguishable_from_a_missing_one(
    session_factory, file_store, served, make_tenant, peft_adapter
):
    acme, globex = make_tenant(session_factory, "acme"), make_tenant(session_factory, "globex")
    upload_dir(session_factory, file_store, served, acme, peft_adapter)
    calls = {
        "find": lambda s, t, n: find_adapter(s, tenant_id=t, name=n),
        "version": lambda s, t, n: find_version(s, tenant_id=t, name=n, number=1),
        "alias": lambda s, t, n: move_alias(s, tenant_id=t, name=n, alias="prod", number=1, actor_key_id=None),
        "delete": lambda s, t, n: delete_adapter(s, tenant_id=t, name=n, force=True),
    }
    for call in calls.values():
        with session_factory() as session:
            with pytest.raises(RegistryNotFoundError) as theirs:
                call(session, globex, "support-bot")
        with session_factory() as session:
            with pytest.raises(RegistryNotFoundError) as missing:
                call(session, globex, "never-existed")
        assert str(theirs.value) == str(missing.value).replace("never-existed", "support-bot")
    with session_factory() as session:
        assert list_adapters(session, tenant_id=globex, limit=10, after=None).items == []
    assert aliases_of(session_factory, acme) == {"latest": 1}


def test_adapter_listing_is_paginated_by_name(session_factory, file_store, served, make_tenant, peft_adapter):
    tenant = make_tenant(session_factory, "acme")
    for name in ("charlie", "alpha", "bravo"):
        upload_dir(session_factory, file_store, served, tenant, peft_adapter, name=name)
    with session_factory() as session:
        first = list_adapters(session, tenant_id=tenant, limit=2, after=None)
        second = list_adapters(session, tenant_id=tenant, limit=2, after=first.items[-1].name)
    assert [a.name for a in first.items] == ["alpha", "bravo"] and first.has_more
    assert [a.name for a in second.items] == ["charlie"] and not second.has_more
    with session_factory() as session:
        assert session.scalar(select(Alias.name).where(Alias.adapter_id == second.items[0].id)) == "latest"
