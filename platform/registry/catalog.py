"""What a tenant can put in `model`, as a list: the names GET /v1/models shows.

Every entry answers a request (references.py): `name` (its `latest` alias), `name:alias` for
each alias, `latest` included (requests may spell it out, so the list shows it), and `name@N`
for each version, listed on request only (they are many and immutable). Only ready versions answer, so an alias or name on a version that is not ready is
left out. Each entry carries the time its own row was made: the adapter's for `name` (the name
has existed since then), the alias's last move for `name:alias` (what it means now dates
from then), the version's for `name@N`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionStatus, Alias, Tenant
from loraloom.platform.registry.references import LATEST_ALIAS


@dataclass(frozen=True)
class ServableName:
    """One callable `model` value. created/owner None: a server-wide name (the base model, the
    server-local adapters), there since the server started and owned by no tenant."""

    id: str
    created: datetime | None = None
    owner: str | None = None


def tenant_catalog(
    session: Session, *, tenant_id: uuid.UUID, include_versions: bool, adapter_name: str | None = None
) -> list[ServableName]:
    """The tenant's callable registry names, by adapter name, then the name, its aliases, its
    versions. adapter_name: only that adapter's (how one id is looked up without listing all)."""
    owner = session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))
    scope = [Adapter.tenant_id == tenant_id, AdapterVersion.status == AdapterVersionStatus.ready]
    if adapter_name is not None:
        scope.append(Adapter.name == adapter_name)
    # (adapter name, order within it, id, created): the order puts the name, then aliases, then versions.
    entries: list[tuple[str, tuple[int, str | int], str, datetime]] = []
    aliases = session.execute(
        select(Adapter.name, Adapter.created_at, Alias.name, Alias.updated_at)
        .join(Alias, Alias.adapter_id == Adapter.id)
        .join(AdapterVersion, AdapterVersion.id == Alias.version_id)
        .where(*scope)
    ).all()
    for name, adapter_created, alias, alias_moved in aliases:
        if alias == LATEST_ALIAS:
            entries.append((name, (0, ""), name, adapter_created))
        entries.append((name, (1, alias), f"{name}:{alias}", alias_moved))
    if include_versions:
        versions = session.execute(
            select(Adapter.name, AdapterVersion.number, AdapterVersion.created_at)
            .join(AdapterVersion, AdapterVersion.adapter_id == Adapter.id)
            .where(*scope)
        ).all()
        entries.extend((name, (2, number), f"{name}@{number}", created) for name, number, created in versions)
    entries.sort(key=lambda entry: (entry[0], entry[1]))
    return [ServableName(id=model_id, created=created, owner=owner) for _, _, model_id, created in entries]
