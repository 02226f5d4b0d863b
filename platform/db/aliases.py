"""Moving, splitting and deleting aliases, always together with their alias_history row."""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import Adapter, AdapterVersion, Alias, AliasAction, AliasHistory, AliasSplit, utcnow


@dataclass(frozen=True)
class JobNote:
    """What a fine-tuning job's promotion adds to its history row: the job, and the gate's comparison
    (None when the job promotes unconditionally)."""

    training_job_id: str
    gate: dict[str, Any] | None = None


def set_alias(
    session: Session,
    *,
    adapter: Adapter,
    name: str,
    version: AdapterVersion,
    actor_key_id: uuid.UUID | None,
    action: AliasAction = AliasAction.set,
    note: JobNote | None = None,
) -> Alias:
    """Create the alias or move it to `version` (ending its split, if it had one); a no-op (and no
    history) if it already names that version alone."""
    _check_own(adapter, name, version)
    alias = _find(session, adapter, name)
    if alias is not None and alias.version_id == version.id and not alias.split:
        return alias
    alias = _point(session, adapter, name, alias, version, actor_key_id, action=action, split=None, note=note)
    alias.split.clear()
    return alias


def record_refusal(session: Session, *, alias: Alias, actor_key_id: uuid.UUID | None, note: JobNote) -> None:
    """Record a promotion the gate refused: the alias stays (from and to its version, with the split it keeps)."""
    split = _split_record((row.version_number, row.weight) for row in alias.split)
    session.add(
        AliasHistory(
            adapter_id=alias.adapter_id,
            alias_name=alias.name,
            from_version_id=alias.version_id,
            to_version_id=alias.version_id,
            changed_by_key_id=actor_key_id,
            changed_at=utcnow(),
            action=AliasAction.gate_refused,
            split=split,
            training_job_id=note.training_job_id,
            gate=note.gate,
        )
    )


def set_split(
    session: Session,
    *,
    adapter: Adapter,
    name: str,
    shares: Sequence[tuple[AdapterVersion, int]],
    actor_key_id: uuid.UUID | None,
) -> Alias:
    """Create the alias or make it split its requests between `shares` (version, weight), at least two
    distinct versions of the adapter; a no-op (and no history) if it splits exactly so already. The
    alias's own version becomes the one with the largest weight (the older on a tie)."""
    for version, _ in shares:
        _check_own(adapter, name, version)
    weights = {version.id: weight for version, weight in shares}
    alias = _find(session, adapter, name)
    if alias is not None and {row.version_id: row.weight for row in alias.split} == weights:
        return alias
    primary = min(shares, key=lambda share: (-share[1], share[0].number))[0]
    recorded = _split_record((version.number, weight) for version, weight in shares)
    alias = _point(session, adapter, name, alias, primary, actor_key_id, action=AliasAction.split, split=recorded)
    # Changed in place: a row deleted and inserted again in one flush could collide on its primary key.
    kept = {row.version_id: row for row in alias.split}
    for version_id in set(kept) - set(weights):
        alias.split.remove(kept[version_id])
    for version, weight in shares:
        row = kept.get(version.id)
        if row is None:
            alias.split.append(AliasSplit(version_id=version.id, adapter_id=adapter.id, version_number=version.number,
                                          weight=weight))
        else:
            row.weight = weight
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
            action=AliasAction.delete,
        )
    )
    session.delete(alias)


def aliases_naming(session: Session, *, version_id: uuid.UUID) -> list[Alias]:
    """The aliases whose requests may run on the version: those pointing at it, and the splits holding it."""
    in_split = select(AliasSplit.alias_id).where(AliasSplit.version_id == version_id)
    return list(session.scalars(select(Alias).where(or_(Alias.version_id == version_id, Alias.id.in_(in_split)))))


def _split_record(shares: Iterable[tuple[int, int]]) -> list[dict[str, int]] | None:
    """A split as alias_history keeps it: (version number, weight) pairs by version; None for no split."""
    return [{"version": number, "weight": weight} for number, weight in sorted(shares)] or None


def _check_own(adapter: Adapter, name: str, version: AdapterVersion) -> None:
    if version.adapter_id != adapter.id:
        raise ValueError(
            f"alias {name!r}: version {version.number} belongs to another adapter; pick a version of {adapter.name!r}"
        )


def _find(session: Session, adapter: Adapter, name: str) -> Alias | None:
    return session.scalar(select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == name))


def _point(
    session: Session,
    adapter: Adapter,
    name: str,
    alias: Alias | None,
    version: AdapterVersion,
    actor_key_id: uuid.UUID | None,
    *,
    action: AliasAction,
    split: list[dict[str, int]] | None,
    note: JobNote | None = None,
) -> Alias:
    """Point the alias (created if None) at `version`, recording the change."""
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
            action=action,
            split=split,
            training_job_id=None if note is None else note.training_job_id,
            gate=None if note is None else note.gate,
        )
    )
    return alias
