"""Moving and deleting aliases, always together with their alias_history row."""
from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import Adapter, AdapterVersion, Alias, AliasHistory, utcnow


def set_alias(
    session: Session,
    *,
    adapter: Adapter,
    name: str,
    version: AdapterVersion,
    actor_key_id: uuid.UUID | None,
) -> Alias:
    """Create the alias or move it to `version`; a no-op (and no history) if it already points there."""
    if version.adapter_id != adapter.id:
        raise ValueError(
            f"alias {name!r}: version {version.number} belongs to another adapter; pick a version of {adapter.name!r}"
        )
    alias = session.scalar(select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == name))
    if alias is not None and alias.version_id == version.id:
        return alias
    now = utcnow()
    previous_version_id = alias.version_id if alias is not None else None
    if alias is None:
        alias = Alias(adapter_id=adapter.id, name=name)
        session.add(alias)
    alias.version_id = version.id
    alias.updated_by_key_id = actor_key_id
    alias.updated_at = now
    session.add(
        AliasHistory(
            adapter_id=adapter.id,
            alias_name=name,
            from_version_id=previous_version_id,
            to_version_id=version.id,
            changed_by_key_id=actor_key_id,
            changed_at=now,
        )
    )
    return alias


def delete_alias(session: Session, *, alias: Alias, actor_key_id: uuid.UUID | None) -> None:
    session.add(
        AliasHistory(
            adapter_id=alias.adapter_id,
            alias_name=alias.name,
            from_version_id=alias.version_id,
            to_version_id=None,
            changed_by_key_id=actor_key_id,
            changed_at=utcnow(),
        )
    )
    session.delete(alias)
