"""Constraints and invariants of the registry tables, checked on the migrated schema."""
from __future__ import annotations

import hashlib
from datetime import timedelta, timezone

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraloom.platform.db.aliases import delete_alias, set_alias
from loraloom.platform.db.api_keys import create_api_key, find_api_key
from loraloom.platform.db.models import (
    Adapter,
    AdapterVersion,
    AdapterVersionFile,
    AdapterVersionSource,
    AdapterVersionStatus,
    Alias,
    AliasHistory,
    ApiKeyRole,
    AuditLogEntry,
    Tenant,
    UsageRecord,
    utcnow,
)


def add_tenant(session: Session, name: str) -> Tenant:
    tenant = Tenant(name=name)
    session.add(tenant)
    session.flush()
    return tenant


def add_adapter(session: Session, tenant: Tenant, name: str) -> Adapter:
    adapter = Adapter(tenant_id=tenant.id, name=name, description="replies to tickets", tags=["support", "en"])
    session.add(adapter)
    session.flush()
    return adapter


def add_version(session: Session, adapter: Adapter, number: int) -> AdapterVersion:
    version = AdapterVersion(
        adapter_id=adapter.id,
        number=number,
        base_model="SmolLM2-135M-Instruct",
        rank=8,
        alpha=16.0,
        target_modules=["q_proj", "v_proj"],
        dtype="float32",
        source=AdapterVersionSource.upload,
    )
    session.add(version)
    session.flush()
    return version


def test_adapter_name_unique_per_tenant(session: Session) -> None:
    acme, globex = add_tenant(session, "acme"), add_tenant(session, "globex")
    add_adapter(session, acme, "support-bot")
    add_adapter(session, globex, "support-bot")  # another tenant may reuse the name
    session.commit()

    with pytest.raises(IntegrityError, match="(?i)unique"):
        add_adapter(session, acme, "support-bot")


def test_version_number_unique_per_adapter(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    first, second = add_adapter(session, tenant, "a"), add_adapter(session, tenant, "b")
    add_version(session, first, 1)
    add_version(session, second, 1)  # numbering is per adapter
    add_version(session, first, 2)
    session.commit()

    with pytest.raises(IntegrityError, match="(?i)unique"):
        add_version(session, first, 2)


def test_alias_moves_are_recorded_in_history(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    key, _ = create_api_key(session, tenant_id=tenant.id, name="ci", role=ApiKeyRole.developer)
    adapter = add_adapter(session, tenant, "support-bot")
    v1, v2 = add_version(session, adapter, 1), add_version(session, adapter, 2)
    session.flush()

    alias = set_alias(session, adapter=adapter, name="prod", version=v1, actor_key_id=key.id)
    set_alias(session, adapter=adapter, name="prod", version=v2, actor_key_id=None)
    set_alias(session, adapter=adapter, name="prod", version=v2, actor_key_id=key.id)  # no move, no row
    session.commit()
    assert session.get(Alias, alias.id).version_id == v2.id
    delete_alias(session, alias=alias, actor_key_id=key.id)
    session.commit()

    history = session.scalars(select(AliasHistory).order_by(AliasHistory.id)).all()
    assert [(h.alias_name, h.from_version_id, h.to_version_id, h.changed_by_key_id) for h in history] == [
        ("prod", None, v1.id, key.id),
        ("prod", v1.id, v2.id, None),
        ("prod", v2.id, None, key.id),
    ]
    assert history[0].changed_at <= history[1].changed_at <= history[2].changed_at
    assert session.scalar(select(func.count()).select_from(Alias)) == 0


def test_alias_can_only_name_a_version_of_its_own_adapter(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    mine, other = add_adapter(session, tenant, "mine"), add_adapter(session, tenant, "other")
    foreign_version = add_version(session, other, 1)
    session.commit()

    with pytest.raises(ValueError, match="belongs to another adapter"):
        set_alias(session, adapter=mine, name="prod", version=foreign_version, actor_key_id=None)
    # The database refuses it too, for writers that bypass set_alias.
    session.add(Alias(adapter_id=mine.id, name="prod", version_id=foreign_version.id))
    with pytest.raises(IntegrityError):
        session.flush()


def test_api_key_stores_only_a_hash(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    key, plaintext = create_api_key(session, tenant_id=tenant.id, name="laptop", role=ApiKeyRole.inference)
    session.commit()

    raw_rows = session.execute(text("SELECT * FROM api_keys")).all()
    assert len(raw_rows) == 1
    assert not any(plaintext in str(value) for value in raw_rows[0])
    assert key.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext.startswith(key.prefix) and len(key.prefix) < len(plaintext) // 3

    found = find_api_key(session, plaintext)
    assert found is not None and found.id == key.id and found.role is ApiKeyRole.inference
    assert find_api_key(session, plaintext + "x") is None
    assert found.is_usable(utcnow())
    found.revoked_at = utcnow()
    session.commit()
    assert not find_api_key(session, plaintext).is_usable(utcnow())


def test_version_content_is_immutable(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    version = add_version(session, add_adapter(session, tenant, "a"), 1)
    session.add(
        AdapterVersionFile(version_id=version.id, filename="adapter_model.safetensors", sha256="ab" * 32, size_bytes=10)
    )
    session.commit()

    version.status = AdapterVersionStatus.ready  # the lifecycle may move
    session.commit()
    version.rank = 16
    with pytest.raises(ValueError, match="rank cannot change"):
        session.flush()
    session.rollback()
    file = session.scalars(select(AdapterVersionFile)).one()
    file.sha256 = "cd" * 32
    with pytest.raises(ValueError, match="sha256 cannot change"):
        session.flush()


def test_timestamps_read_back_as_utc(session: Session) -> None:
    add_tenant(session, "acme")
    session.commit()
    session.expunge_all()

    created = session.scalars(select(Tenant)).one().created_at

    assert created.tzinfo == timezone.utc
    assert abs(utcnow() - created) < timedelta(minutes=5)


def test_deleting_a_tenant_cascades_but_logs_remain(session: Session) -> None:
    tenant = add_tenant(session, "acme")
    key, _ = create_api_key(session, tenant_id=tenant.id, name="admin", role=ApiKeyRole.admin)
    adapter = add_adapter(session, tenant, "support-bot")
    version = add_version(session, adapter, 1)
    session.add(
        AdapterVersionFile(version_id=version.id, filename="adapter_config.json", sha256="ef" * 32, size_bytes=300)
    )
    set_alias(session, adapter=adapter, name="prod", version=version, actor_key_id=key.id)
    session.add(
        UsageRecord(
            tenant_id=tenant.id,
            api_key_id=key.id,
            adapter_version_id=version.id,
            model="support-bot:prod",
            request_id="req-1",
            endpoint="chat.completions",
            prompt_tokens=12,
            completion_tokens=30,
        )
    )
    session.add(
        AuditLogEntry(
            tenant_id=tenant.id,
            actor_key_id=key.id,
            action="alias.move",
            resource_type="alias",
            resource_id="support-bot:prod",
            status_code=200,
            details={"to": 1},
        )
    )
    session.commit()

    session.delete(tenant)
    session.commit()

    for model in [Adapter, AdapterVersion, AdapterVersionFile, Alias, AliasHistory]:
        assert session.scalar(select(func.count()).select_from(model)) == 0, model.__tablename__
    assert session.scalar(select(func.count()).select_from(UsageRecord)) == 1
    assert session.scalars(select(AuditLogEntry)).one().details == {"to": 1}
