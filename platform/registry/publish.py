"""Register a validated adapter directory as a new immutable version: blobs first, then one
database transaction that adds the version, its files and moves `latest`.

All or nothing: if anything fails, the blobs this registration added are deleted again
and the transaction is rolled back, so a refused upload leaves no row and no blob.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraloom.engine.adapter_cache import file_sha256
from loraloom.engine.lora_weights import AdapterSummary
from loraloom.platform.db.aliases import set_alias
from loraloom.platform.db.models import (
    Adapter,
    AdapterVersion,
    AdapterVersionFile,
    AdapterVersionSource,
    AdapterVersionStatus,
)
from loraloom.platform.registry.references import LATEST_ALIAS, check_adapter_name
from loraloom.platform.registry.staging import ADAPTER_FILES
from loraloom.platform.registry.validation import ServedBase, validate_adapter_dir
from loraloom.platform.storage import BlobRef, BlobStore, content_key

# Concurrent uploads to one adapter race for the next version number (a unique constraint):
# the loser retries with the number after the winner's.
REGISTER_ATTEMPTS = 3


@dataclass(frozen=True)
class StoredFile:
    filename: str
    ref: BlobRef


class NewBlobs:
    """The blobs one registration added to storage, so that a failure can take them back.
    Blobs that already existed (the same bytes in another version) are never touched."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.keys: list[str] = []

    def note(self, key: str, *, existed: bool) -> None:
        if not existed:
            self.keys.append(key)

    def delete_all(self) -> None:
        for key in self.keys:
            self.store.delete(key)


@contextmanager
def all_or_nothing(store: BlobStore) -> Iterator[NewBlobs]:
    new_blobs = NewBlobs(store)
    try:
        yield new_blobs
    except BaseException:
        new_blobs.delete_all()
        raise


def store_adapter_files(directory: Path, *, store: BlobStore, new_blobs: NewBlobs) -> list[StoredFile]:
    stored = []
    for filename in ADAPTER_FILES:
        path = directory / filename
        existed = store.exists(content_key(file_sha256(path)))
        ref = store.put_file(path)
        new_blobs.note(ref.key, existed=existed)
        stored.append(StoredFile(filename=filename, ref=ref))
    return stored


def publish_adapter_dir(
    session: Session,
    *,
    store: BlobStore,
    tenant_id: uuid.UUID,
    adapter_name: str,
    directory: Path,
    base: ServedBase,
    allow_base_mismatch: bool,
    source: AdapterVersionSource,
    training_job_id: str | None,
    actor_key_id: uuid.UUID | None,
) -> AdapterVersion:
    """Validate the PEFT files in `directory` and register them as the adapter's next version
    (what an upload and a finished training job both end with)."""
    check_adapter_name(adapter_name, reserved=base.reserved_names)
    summary = validate_adapter_dir(directory, base=base, allow_base_mismatch=allow_base_mismatch)
    with all_or_nothing(store) as new_blobs:
        files = store_adapter_files(directory, store=store, new_blobs=new_blobs)
        return register_version(
            session,
            tenant_id=tenant_id,
            adapter_name=adapter_name,
            summary=summary,
            files=files,
            base_model=base.name,
            source=source,
            training_job_id=training_job_id,
            actor_key_id=actor_key_id,
        )


def register_version(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    adapter_name: str,
    summary: AdapterSummary,
    files: list[StoredFile],
    base_model: str,
    source: AdapterVersionSource,
    training_job_id: str | None,
    actor_key_id: uuid.UUID | None,
) -> AdapterVersion:
    """Add version N+1 of the adapter (creating the adapter on its first version) and point `latest`
    at it, in one transaction. The files must already be in storage."""
    attempt = 1
    while True:
        try:
            adapter = session.scalar(
                select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == adapter_name)
            )
            if adapter is None:
                adapter = Adapter(tenant_id=tenant_id, name=adapter_name)
                session.add(adapter)
                session.flush()
            # Deleted versions count: a number, once given, never names other weights.
            highest = session.scalar(
                select(func.max(AdapterVersion.number)).where(AdapterVersion.adapter_id == adapter.id)
            )
            version = AdapterVersion(
                adapter_id=adapter.id,
                number=(highest or 0) + 1,
                status=AdapterVersionStatus.ready,
                base_model=base_model,
                rank=summary.rank,
                alpha=summary.alpha,
                target_modules=list(summary.target_modules),
                dtype=summary.dtype,
                source=source,
                training_job_id=training_job_id,
                created_by_key_id=actor_key_id,
                files=[
                    AdapterVersionFile(filename=file.filename, sha256=file.ref.sha256, size_bytes=file.ref.size)
                    for file in files
                ],
            )
            session.add(version)
            session.flush()
            set_alias(session, adapter=adapter, name=LATEST_ALIAS, version=version, actor_key_id=actor_key_id)
            adapter.updated_at = version.created_at
            session.commit()
            return version
        except IntegrityError:  # another upload took this number (or created the adapter) first
            session.rollback()
            if attempt == REGISTER_ATTEMPTS:
                raise
            attempt += 1
