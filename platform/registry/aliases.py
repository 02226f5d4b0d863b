"""Moving aliases: promote and rollback are both a move, and every move is in alias_history.

`latest` belongs to the registry (it follows uploads and deletions); every other alias
moves only when told to.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from loraloom.engine import RequestFieldError
from loraloom.platform.db.aliases import delete_alias, set_alias
from loraloom.platform.db.changes import announce_adapter_change
from loraloom.platform.db.models import Adapter, AdapterVersion, Alias, AliasHistory, utcnow
from loraloom.platform.registry.errors import RegistryNotFoundError
from loraloom.platform.registry.references import LATEST_ALIAS, check_alias_name
from loraloom.platform.registry.resolution import ResolvedVersion
from loraloom.platform.registry.versions import find_adapter, find_version


@dataclass(frozen=True)
class AliasMove:
    from_version: int | None  # None: the alias was created
    to_version: int | None  # None: the alias was deleted
    changed_by_key_id: uuid.UUID | None
    changed_at: datetime


def move_alias(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    alias: str,
    number: int,
    actor_key_id: uuid.UUID | None,
) -> tuple[Alias, ResolvedVersion]:
    """Point `alias` at version `number` (creating the alias if new); returns the alias and the version
    it now names, which the caller prefetches into the engines."""
    _check_movable(alias)
    # Locked before reading: the version's status (a concurrent delete) and the alias's current
    # version, which history records as from_version (concurrent moves must chain).
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    version = find_version(session, tenant_id=tenant_id, name=name, number=number)
    row = set_alias(session, adapter=adapter, name=alias, version=version, actor_key_id=actor_key_id)
    adapter.updated_at = utcnow()
    announce_adapter_change(session, tenant_id=tenant_id, adapter_name=name)
    session.commit()
    return row, ResolvedVersion.of(version, adapter)


def remove_alias(session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None) -> None:
    _check_movable(alias)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    delete_alias(session, alias=_find_alias(session, adapter=adapter, alias=alias), actor_key_id=actor_key_id)
    adapter.updated_at = utcnow()
    announce_adapter_change(session, tenant_id=tenant_id, adapter_name=name)
    session.commit()


def find_alias(session: Session, *, tenant_id: uuid.UUID, name: str, alias: str) -> Alias:
    return _find_alias(session, adapter=find_adapter(session, tenant_id=tenant_id, name=name), alias=alias)


def alias_history(session: Session, *, tenant_id: uuid.UUID, name: str, alias: str) -> list[AliasMove]:
    """Every move of the alias, oldest first (also for an alias that no longer exists)."""
    adapter = find_adapter(session, tenant_id=tenant_id, name=name)
    source, target = aliased(AdapterVersion), aliased(AdapterVersion)
    rows = session.execute(
        select(AliasHistory, source.number, target.number)
        .outerjoin(source, AliasHistory.from_version_id == source.id)
        .outerjoin(target, AliasHistory.to_version_id == target.id)
        .where(AliasHistory.adapter_id == adapter.id, AliasHistory.alias_name == alias)
        .order_by(AliasHistory.id)
    )
    moves = [
        AliasMove(
            from_version=from_number,
            to_version=to_number,
            changed_by_key_id=entry.changed_by_key_id,
            changed_at=entry.changed_at,
        )
        for entry, from_number, to_number in rows
    ]
    if not moves:
        raise RegistryNotFoundError(f"adapter {name!r} has never had an alias {alias!r}")
    return moves


def _find_alias(session: Session, *, adapter: Adapter, alias: str) -> Alias:
    row = session.scalar(select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias))
    if row is None:
        raise RegistryNotFoundError(f"adapter {adapter.name!r} has no alias {alias!r}")
    return row


def _check_movable(alias: str) -> None:
    check_alias_name(alias)
    if alias == LATEST_ALIAS:
        raise RequestFieldError(
            "alias", f"{LATEST_ALIAS!r} always names the newest version and moves by itself; "
            "use another alias (e.g. prod) to pin a version"
        )
