"""Moving aliases: to one version, or split between versions by weight (a canary rollout, splits.py),
which `promote` turns into one of its versions and `rollback` into the version the alias named before
the split. Every change is in alias_history, with what it did and the split it set; a fine-tuning job's
promotion (training/promotion.py) moves an alias through `move_alias` too, or records with `keep_alias`
that its gate left the alias where it was, each entry naming the job and the gate's comparison.

`latest` belongs to the registry (it follows uploads and deletions); every other alias
moves only when told to.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from loraloom.engine import RequestFieldError
from loraloom.platform.db.aliases import JobNote, delete_alias, record_refusal, set_alias, set_split
from loraloom.platform.db.changes import announce_adapter_change
from loraloom.platform.db.models import (
    Adapter,
    AdapterVersion,
    AdapterVersionStatus,
    Alias,
    AliasAction,
    AliasHistory,
    utcnow,
)
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.references import LATEST_ALIAS, check_alias_name
from loraloom.platform.registry.resolution import ResolvedVersion
from loraloom.platform.registry.splits import Share, check_shares, describe
from loraloom.platform.registry.versions import find_adapter, find_version


@dataclass(frozen=True)
class AliasMove:
    from_version: int | None  # None: the alias was created
    to_version: int | None  # None: the alias was deleted
    changed_by_key_id: uuid.UUID | None
    changed_at: datetime
    action: AliasAction = AliasAction.set
    split: tuple[Share, ...] | None = None  # the split this change set
    training_job_id: str | None = None  # the fine-tuning job whose promotion made the change
    gate: dict[str, Any] | None = None  # that promotion's comparison of validation losses


@dataclass(frozen=True)
class AliasTarget:
    """What an alias names: one version, or a split (then `version` is its largest-weight version)."""

    version: int
    split: tuple[Share, ...] | None

    @property
    def versions(self) -> tuple[int, ...]:
        return (self.version,) if self.split is None else tuple(share.version for share in self.split)


def alias_split(alias: Alias) -> tuple[Share, ...] | None:
    """The alias's split by version number; None while it names one version."""
    # Sorted here: the relationship is ordered when loaded, not as rows are added to it.
    shares = sorted((Share(row.version_number, row.weight) for row in alias.split), key=lambda share: share.version)
    return tuple(shares) or None


def move_alias(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    alias: str,
    number: int,
    actor_key_id: uuid.UUID | None,
    action: AliasAction = AliasAction.set,
    note: JobNote | None = None,
) -> tuple[Alias, ResolvedVersion]:
    """Point `alias` at version `number` (creating the alias if new); returns the alias and the version
    it now names, which the caller prefetches into the engines. `action` and `note`: how history tells
    the move (a job's promotion names its job and comparison)."""
    _check_movable(alias)
    # Locked before reading: the version's status (a concurrent delete) and the alias's current
    # version, which history records as from_version (concurrent moves must chain).
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    version = find_version(session, tenant_id=tenant_id, name=name, number=number)
    row = set_alias(session, adapter=adapter, name=alias, version=version, actor_key_id=actor_key_id,
                    action=action, note=note)
    return row, _committed(session, tenant_id, adapter, [version])[0]


def split_alias(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    alias: str,
    shares: Sequence[Share],
    actor_key_id: uuid.UUID | None,
) -> tuple[Alias, list[ResolvedVersion]]:
    """Split the alias's requests between versions by weight (creating the alias if new); returns the
    alias and its versions, which the caller prefetches into the engines."""
    _check_movable(alias)
    check_shares(shares)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    versions = [_split_version(session, tenant_id, name, index, share) for index, share in enumerate(shares)]
    row = set_split(session, adapter=adapter, name=alias, actor_key_id=actor_key_id,
                    shares=[(version, share.weight) for version, share in zip(versions, shares)])
    return row, _committed(session, tenant_id, adapter, versions)


def promote_alias(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    alias: str,
    number: int | None,
    actor_key_id: uuid.UUID | None,
) -> tuple[Alias, ResolvedVersion]:
    """End the alias's split on one of its versions: `number`, else the split's newest (the canary)."""
    _check_movable(alias)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    split = _current_split(session, adapter, alias, "promote")
    if number is None:
        number = split[-1].version
    elif number not in {share.version for share in split}:
        raise RequestFieldError(
            "version", f"version {number} is not in {name}:{alias}'s split ({describe(split)}); promote one of its "
            f"versions, or point the alias anywhere with PUT /v1/adapters/{name}/aliases/{alias}"
        )
    version = find_version(session, tenant_id=tenant_id, name=name, number=number)
    row = set_alias(session, adapter=adapter, name=alias, version=version, actor_key_id=actor_key_id,
                    action=AliasAction.promote)
    return row, _committed(session, tenant_id, adapter, [version])[0]


def rollback_alias(
    session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None
) -> tuple[Alias, ResolvedVersion]:
    """End the alias's split on the version the alias named before the split began."""
    _check_movable(alias)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    _current_split(session, adapter, alias, "roll back")
    before = _version_before_split(session, adapter, alias)
    if before is None:
        raise RegistryConflictError(
            f"{name}:{alias} was created as a split and named no version before it; point it at one with "
            f"PUT /v1/adapters/{name}/aliases/{alias} or promote one of its versions"
        )
    version = session.get(AdapterVersion, before)
    if version is None or version.status != AdapterVersionStatus.ready:
        raise RegistryConflictError(
            f"{name}:{alias} named a version before its split that is deleted now; promote one of the split's "
            f"versions or PUT /v1/adapters/{name}/aliases/{alias} with another"
        )
    row = set_alias(session, adapter=adapter, name=alias, version=version, actor_key_id=actor_key_id,
                    action=AliasAction.rollback)
    return row, _committed(session, tenant_id, adapter, [version])[0]


def keep_alias(
    session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None, note: JobNote
) -> None:
    """Record in the alias's history that a job's promotion left it where it is (`gate_refused`); commits."""
    _check_movable(alias)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    row = _find_alias(session, adapter=adapter, alias=alias)
    record_refusal(session, alias=row, actor_key_id=actor_key_id, note=note)
    session.commit()


def alias_target(
    session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, lock: bool = False
) -> AliasTarget | None:
    """What the alias names now; None when the adapter or the alias does not exist. `lock`: hold the
    adapter's row, so that a move in the same transaction starts from what this read."""
    try:
        adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=lock)
    except RegistryNotFoundError:
        return None
    row = session.scalar(select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias))
    return None if row is None else AliasTarget(version=row.version.number, split=alias_split(row))


def remove_alias(session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None) -> None:
    _check_movable(alias)
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    delete_alias(session, alias=_find_alias(session, adapter=adapter, alias=alias), actor_key_id=actor_key_id)
    _committed(session, tenant_id, adapter, [])


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
            action=entry.action,
            split=None if entry.split is None else tuple(Share(s["version"], s["weight"]) for s in entry.split),
            training_job_id=entry.training_job_id,
            gate=entry.gate,
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


def _split_version(session: Session, tenant_id: uuid.UUID, name: str, index: int, share: Share) -> AdapterVersion:
    try:
        return find_version(session, tenant_id=tenant_id, name=name, number=share.version)
    except RegistryNotFoundError:
        raise RequestFieldError(
            f"split[{index}].version", f"adapter {name!r} has no version {share.version}; "
            f"GET /v1/adapters/{name}/versions lists them"
        ) from None


def _current_split(session: Session, adapter: Adapter, alias: str, doing: str) -> tuple[Share, ...]:
    split = alias_split(_find_alias(session, adapter=adapter, alias=alias))
    if split is None:
        raise RegistryConflictError(
            f"{adapter.name}:{alias} is not split between versions, so there is nothing to {doing}; point it at a "
            f"version with PUT /v1/adapters/{adapter.name}/aliases/{alias}"
        )
    return split


def _version_before_split(session: Session, adapter: Adapter, alias: str) -> uuid.UUID | None:
    """The version the alias last named alone before its current split (None: it was created split)."""
    changes = session.scalars(
        select(AliasHistory)
        .where(AliasHistory.adapter_id == adapter.id, AliasHistory.alias_name == alias)
        .order_by(AliasHistory.id.desc())
    )
    for change in changes:
        if change.action is not AliasAction.split:
            return change.to_version_id  # None after a deletion: the split created the alias anew
    return None


def _committed(
    session: Session, tenant_id: uuid.UUID, adapter: Adapter, versions: list[AdapterVersion]
) -> list[ResolvedVersion]:
    """Commit an alias change, announced to the other gateways; the versions it names, as plain values."""
    adapter.updated_at = utcnow()
    announce_adapter_change(session, tenant_id=tenant_id, adapter_name=adapter.name)
    resolved = [ResolvedVersion.of(version, adapter) for version in versions]
    session.commit()
    return resolved


def _check_movable(alias: str) -> None:
    check_alias_name(alias)
    if alias == LATEST_ALIAS:
        raise RequestFieldError(
            "alias", f"{LATEST_ALIAS!r} always names the newest version and moves by itself; "
            "use another alias (e.g. prod) to pin a version"
        )
