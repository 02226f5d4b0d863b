"""The registry as the API changes it: pushes (through the gateway, or presigned straight to storage),
alias moves and deletions.

RegistryService owns what a change needs: the blob store, the upload limits, the staging folder and
the served base every version must fit. It also owns the resolution cache that the request path's
lookup reads (lookup.py), and after every change it commits it forgets that adapter's cached answers
itself, so that a route has nothing to remember after calling it. Other gateways on the same
database hear of the change from the database and forget theirs (`changes`, run by the app).

Reading (listing adapters, finding a version or an alias) needs none of this: the routes call
versions.py and aliases.py for that.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from loraloom.engine import AdapterHandle
from loraloom.platform.db.change_listener import ChangeListener, InProcessChangeListener, change_listener_for
from loraloom.platform.db.models import Alias
from loraloom.platform.registry.aliases import move_alias, promote_alias, remove_alias, rollback_alias, split_alias
from loraloom.platform.registry.leftovers import remove_upload_leftovers
from loraloom.platform.registry.publish import Published
from loraloom.platform.registry.resolution import ResolutionCache, ResolvedVersion
from loraloom.platform.registry.splits import Share
from loraloom.platform.registry.staging import UploadedPart, UploadLimits
from loraloom.platform.registry.uploads import (
    PlannedFile,
    PresignedFile,
    UploadedFile,
    UploadTarget,
    complete_presigned_upload,
    request_presigned_uploads,
    upload_version,
)
from loraloom.platform.registry.validation import ServedBase
from loraloom.platform.registry.versions import delete_adapter, delete_unreferenced_blobs, delete_version
from loraloom.platform.settings import Settings
from loraloom.platform.storage import BlobStore

RESOLUTION_CACHE_ENTRIES = 100_000  # (tenant, reference) answers; a few hundred bytes each

# What tells the engine to drop a deleted version's copies (EngineClient.unload_adapter).
Unload = Callable[[str], None]


class RegistryService:
    def __init__(
        self,
        *,
        store: BlobStore,
        base: ServedBase,
        resolutions: ResolutionCache,
        upload_limits: UploadLimits,
        staging_dir: Path,
        presigned_expires_s: int,
        changes: ChangeListener | None = None,
    ) -> None:
        self.store = store
        self.base = base
        self.resolutions = resolutions
        self.upload_limits = upload_limits
        self.staging_dir = staging_dir
        self.presigned_expires_s = presigned_expires_s
        # Keeps `resolutions` honest about the changes other gateways make; the app's lifespan runs it.
        self.changes = changes if changes is not None else InProcessChangeListener()

    # ------------------------------------------------------------------ pushes
    def upload_version(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, actor_key_id: uuid.UUID | None,
        parts: Sequence[UploadedPart],
    ) -> Published:
        """The uploaded files (the two PEFT files or one archive of them) as the adapter's next version,
        or the version holding them already."""
        published = upload_version(session, self._target(tenant_id, name, actor_key_id), parts)
        self._changed(tenant_id, name)
        return published

    def request_presigned_uploads(self, *, name: str, files: Sequence[PlannedFile]) -> list[PresignedFile]:
        """Presigned PUTs for the files; nothing changes until complete_presigned_upload."""
        return request_presigned_uploads(
            store=self.store, adapter_name=name, files=files, limits=self.upload_limits, base=self.base,
            expires_s=self.presigned_expires_s,
        )

    def complete_presigned_upload(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, actor_key_id: uuid.UUID | None,
        files: Sequence[UploadedFile],
    ) -> Published:
        published = complete_presigned_upload(session, self._target(tenant_id, name, actor_key_id), files)
        self._changed(tenant_id, name)
        return published

    # ------------------------------------------------------------------ aliases
    def move_alias(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, number: int,
        actor_key_id: uuid.UUID | None,
    ) -> tuple[Alias, AdapterHandle]:
        """Point the alias at version `number`; returns the alias and the handle of the version it now
        names, for the caller to prefetch into the engine."""
        row, version = move_alias(
            session, tenant_id=tenant_id, name=name, alias=alias, number=number, actor_key_id=actor_key_id
        )
        self._changed(tenant_id, name)
        return row, version.handle(self.store)

    def split_alias(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, shares: Sequence[Share],
        actor_key_id: uuid.UUID | None,
    ) -> tuple[Alias, list[AdapterHandle]]:
        """Split the alias's requests between versions by weight; returns the alias and the handles of its
        versions, for the caller to prefetch."""
        row, versions = split_alias(
            session, tenant_id=tenant_id, name=name, alias=alias, shares=shares, actor_key_id=actor_key_id
        )
        self._changed(tenant_id, name)
        return row, [version.handle(self.store) for version in versions]

    def promote_alias(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, number: int | None,
        actor_key_id: uuid.UUID | None,
    ) -> tuple[Alias, AdapterHandle]:
        """End the alias's split on version `number` (None: the split's newest)."""
        row, version = promote_alias(
            session, tenant_id=tenant_id, name=name, alias=alias, number=number, actor_key_id=actor_key_id
        )
        self._changed(tenant_id, name)
        return row, version.handle(self.store)

    def rollback_alias(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None
    ) -> tuple[Alias, AdapterHandle]:
        """End the alias's split on the version it named before the split."""
        row, version = rollback_alias(session, tenant_id=tenant_id, name=name, alias=alias, actor_key_id=actor_key_id)
        self._changed(tenant_id, name)
        return row, version.handle(self.store)

    def remove_alias(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, alias: str, actor_key_id: uuid.UUID | None
    ) -> None:
        remove_alias(session, tenant_id=tenant_id, name=name, alias=alias, actor_key_id=actor_key_id)
        self._changed(tenant_id, name)

    # ------------------------------------------------------------------ deletions
    def delete_version(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, number: int, force: bool,
        actor_key_id: uuid.UUID | None, unload: Unload,
    ) -> None:
        """Delete the version (versions.delete_version says when it is refused), then `unload` it from
        the engine and delete the blobs nothing else references."""
        removed = delete_version(
            session, tenant_id=tenant_id, name=name, number=number, force=force, actor_key_id=actor_key_id
        )
        self._changed(tenant_id, name)
        self._forget(session, [removed], unload)

    def delete_adapter(
        self, session: Session, *, tenant_id: uuid.UUID, name: str, force: bool, unload: Unload
    ) -> None:
        """Delete the adapter with all its versions, then unload and collect them as delete_version does."""
        removed = delete_adapter(session, tenant_id=tenant_id, name=name, force=force)
        self._changed(tenant_id, name)
        self._forget(session, removed, unload)

    # ------------------------------------------------------------------
    def _target(self, tenant_id: uuid.UUID, name: str, actor_key_id: uuid.UUID | None) -> UploadTarget:
        return UploadTarget(
            store=self.store, staging_dir=self.staging_dir, limits=self.upload_limits, base=self.base,
            tenant_id=tenant_id, adapter_name=name, actor_key_id=actor_key_id,
        )

    def _changed(self, tenant_id: uuid.UUID, name: str) -> None:
        """After a committed change: this gateway's next request for the adapter reads it afresh."""
        self.resolutions.invalidate(tenant_id, name)

    def _forget(self, session: Session, versions: list[ResolvedVersion], unload: Unload) -> None:
        """Deleted versions, once committed: out of the engine first, so that no copy outlives its blobs."""
        for version in versions:
            unload(version.key)
        delete_unreferenced_blobs(session, store=self.store, versions=versions)


def registry_service_from_settings(settings: Settings, store: BlobStore, base: ServedBase) -> RegistryService:
    """The registry in settings.database_url for a server serving `base`. Called once as a server starts,
    which is when the upload leftovers of killed servers are removed."""
    settings.staging_dir.mkdir(parents=True, exist_ok=True)
    remove_upload_leftovers(settings, store)
    resolutions = ResolutionCache(capacity=RESOLUTION_CACHE_ENTRIES, ttl_s=settings.adapter_resolution_ttl_s)
    return RegistryService(
        store=store,
        base=base,
        resolutions=resolutions,
        upload_limits=UploadLimits(max_total_bytes=settings.adapter_upload_max_bytes),
        staging_dir=settings.staging_dir,
        presigned_expires_s=settings.presigned_url_expires_s,
        changes=change_listener_for(settings.database_url, resolutions),
    )
