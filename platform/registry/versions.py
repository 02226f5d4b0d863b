"""Reading and deleting adapters and their versions, always within one tenant.

Another tenant's adapter is answered exactly like a missing one. A deleted version keeps
its row (status `deleted`): its number is never given to other weights, and alias
history keeps naming it. Its blobs go once nothing references them (db/blob_references.py).
"""
from __future__ import annotations

import uuid

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, selectinload

from loraloom.platform.db.aliases import aliases_naming, delete_alias, set_alias
from loraloom.platform.db.changes import announce_adapter_change
from loraloom.platform.db.locking import for_update
from loraloom.platform.db.models import (
    Adapter,
    AdapterVersion,
    AdapterVersionStatus,
    Alias,
    utcnow,
)
from loraloom.platform.db.pages import Page, fetch_page
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.references import LATEST_ALIAS
from loraloom.platform.registry.blobs import collect_blob
from loraloom.platform.registry.resolution import ResolvedVersion
from loraloom.platform.storage import BlobStore

LIVE = AdapterVersion.status != AdapterVersionStatus.deleted


def find_adapter(session: Session, *, tenant_id: uuid.UUID, name: str, lock: bool = False) -> Adapter:
    """`lock`: hold the adapter's row (SELECT ... FOR UPDATE on PostgreSQL; SQLite has one writer at a
    time anyway) until the transaction ends. Every change to an adapter's versions or aliases takes
    it first, so they run one after another: what one reads (a version's status, where an alias
    points) cannot change under it before it commits."""
    query = select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name)
    adapter = session.scalar(for_update(session, query) if lock else query)
    if adapter is None:
        raise RegistryNotFoundError(f"adapter {name!r} does not exist; GET /v1/adapters lists yours")
    return adapter


def list_adapters(session: Session, *, tenant_id: uuid.UUID, limit: int, after: str | None) -> Page[Adapter]:
    """Adapters by name; `after` is the last name of the previous page. Their aliases, the aliases'
    versions and those versions' files come in one query per level for the whole page (not one per
    adapter): the listing shows the latest version's rank, modules and size."""
    query = (
        select(Adapter)
        .where(Adapter.tenant_id == tenant_id)
        .options(selectinload(Adapter.aliases).selectinload(Alias.version).selectinload(AdapterVersion.files))
        .order_by(Adapter.name)
    )
    if after is not None:
        query = query.where(Adapter.name > after)
    return fetch_page(session, query, limit)


def find_version(session: Session, *, tenant_id: uuid.UUID, name: str, number: int) -> AdapterVersion:
    adapter = find_adapter(session, tenant_id=tenant_id, name=name)
    version = session.scalar(
        select(AdapterVersion)
        .where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.number == number, LIVE)
        .options(selectinload(AdapterVersion.files))
    )
    if version is None:
        raise RegistryNotFoundError(f"adapter {name!r} has no version {number}; GET /v1/adapters/{name}/versions lists them")
    return version


def list_versions(
    session: Session, *, tenant_id: uuid.UUID, name: str, limit: int, after: int | None
) -> Page[AdapterVersion]:
    """Live versions by number; `after` is the last number of the previous page."""
    adapter = find_adapter(session, tenant_id=tenant_id, name=name)
    query = (
        select(AdapterVersion)
        .where(AdapterVersion.adapter_id == adapter.id, LIVE)
        .options(selectinload(AdapterVersion.files))
        .order_by(AdapterVersion.number)
    )
    if after is not None:
        query = query.where(AdapterVersion.number > after)
    return fetch_page(session, query, limit)


def version_aliases(session: Session, *, version: AdapterVersion) -> list[str]:
    """The aliases whose requests may run on the version (a split's versions all name it)."""
    return sorted(alias.name for alias in aliases_naming(session, version_id=version.id))


def delete_version(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    number: int,
    force: bool,
    actor_key_id: uuid.UUID | None,
) -> ResolvedVersion:
    """Mark a version deleted. Refused while an alias other than `latest` points at it, unless
    `force` (then those aliases are removed, in their history). `latest` moves back to the
    newest remaining version, or goes when none is left. Returns what the caller needs to
    unload it from engines and to collect its blobs."""
    # Locked: an alias moving onto this version at the same time either commits first (and is seen
    # here, so the delete is refused) or waits and then finds the version deleted.
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    version = find_version(session, tenant_id=tenant_id, name=name, number=number)
    aliases = aliases_naming(session, version_id=version.id)  # a split holding it too
    pinned = sorted(alias.name for alias in aliases if alias.name != LATEST_ALIAS)
    if pinned and not force:
        raise RegistryConflictError(
            f"version {number} of {name!r} is what alias(es) {', '.join(pinned)} point at; move them first "
            f"(PUT /v1/adapters/{name}/aliases/<alias>) or delete with force=true, which removes them"
        )
    resolved = ResolvedVersion.of(version, adapter)
    version.status = AdapterVersionStatus.deleted
    version.status_detail = f"deleted at {utcnow().isoformat()}"
    session.flush()
    for alias in aliases:
        if alias.name == LATEST_ALIAS:
            _move_latest_back(session, adapter=adapter, alias=alias, actor_key_id=actor_key_id)
        else:
            delete_alias(session, alias=alias, actor_key_id=actor_key_id)
    adapter.updated_at = utcnow()
    announce_adapter_change(session, tenant_id=tenant_id, adapter_name=name)
    session.commit()
    return resolved


def _move_latest_back(session: Session, *, adapter: Adapter, alias: Alias, actor_key_id: uuid.UUID | None) -> None:
    newest = session.scalar(
        select(AdapterVersion)
        .where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.status == AdapterVersionStatus.ready)
        .order_by(AdapterVersion.number.desc())
        .limit(1)
    )
    if newest is None:
        delete_alias(session, alias=alias, actor_key_id=actor_key_id)
    else:
        set_alias(session, adapter=adapter, name=LATEST_ALIAS, version=newest, actor_key_id=actor_key_id)


def delete_adapter(session: Session, *, tenant_id: uuid.UUID, name: str, force: bool) -> list[ResolvedVersion]:
    """Delete the adapter with its versions, aliases and alias history; returns its live versions
    (to unload from engines and to collect blobs). Refused, as delete_version is, while an alias
    other than `latest` points at one of its versions, unless `force`."""
    # Locked like delete_version: an alias set at the same time is either seen here or finds no adapter.
    adapter = find_adapter(session, tenant_id=tenant_id, name=name, lock=True)
    pinned = sorted(session.scalars(
        select(Alias.name).where(Alias.adapter_id == adapter.id, Alias.name != LATEST_ALIAS)
    ))
    if pinned and not force:
        raise RegistryConflictError(
            f"adapter {name!r} has alias(es) {', '.join(pinned)} that clients may be calling; remove them first "
            f"(DELETE /v1/adapters/{name}/aliases/<alias>) or delete with force=true, which removes them too"
        )
    versions = session.scalars(
        select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id, LIVE).options(selectinload(AdapterVersion.files))
    )
    removed = [ResolvedVersion.of(version, adapter) for version in versions]
    # One statement, so the database's ON DELETE CASCADE removes versions, aliases and history
    # together (the ORM deleting children one by one would trip alias_history's foreign keys).
    session.execute(delete(Adapter).where(Adapter.id == adapter.id))
    announce_adapter_change(session, tenant_id=tenant_id, adapter_name=name)
    session.commit()
    session.expunge_all()
    return removed


def delete_unreferenced_blobs(session: Session, *, store: BlobStore, versions: list[ResolvedVersion]) -> list[str]:
    """Delete the blobs of `versions` that nothing else (a live version, a checkpoint, a training
    file, of any tenant) still references; returns the deleted sha256s."""
    deleted = []
    for sha256 in sorted({digest for v in versions for digest in (v.weights_sha256, v.config_sha256)}):
        if collect_blob(session, store, sha256):
            deleted.append(sha256)
    return deleted
