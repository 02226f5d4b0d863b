"""Register a validated adapter directory as a new immutable version: blobs first, then one
database transaction that adds the version, its files and moves `latest`.

All or nothing: the blobs are claimed while they are stored (registry/blobs.py), and if anything
fails the transaction is rolled back and the blobs nothing else holds are collected, so a refused
upload leaves no row and no blob, and a deletion running beside it never takes its bytes.

Content seen before is not registered again: when a ready version of the same adapter holds the
same files byte for byte (the weights, the adapter_config.json that scales them, and its chat template if any), that
version is the answer, `deduplicated`, and nothing is written (no row, no alias move, no blob).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterSummary, file_sha256
from loraloom.platform.db.aliases import set_alias
from loraloom.platform.db.changes import announce_adapter_change
from loraloom.platform.db.locking import for_update
from loraloom.platform.db.models import (
    MAX_DECLARED_BASE_CHARS,
    Adapter,
    AdapterVersion,
    AdapterVersionFile,
    AdapterVersionSource,
    AdapterVersionStatus,
)
from loraloom.platform.registry.blobs import claimed_blobs
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE
from loraloom.platform.registry.errors import RegistryConflictError
from loraloom.platform.registry.references import LATEST_ALIAS, check_adapter_name
from loraloom.platform.registry.staging import ADAPTER_FILES
from loraloom.platform.registry.tool_parsers import declared_tool_parser
from loraloom.platform.registry.validation import ServedBase, validate_adapter_dir
from loraloom.platform.storage import BlobRef, BlobStore

# Concurrent uploads to one adapter race for the next version number (a unique constraint):
# the loser retries with the number after the winner's.
REGISTER_ATTEMPTS = 3


@dataclass(frozen=True)
class StoredFile:
    filename: str
    ref: BlobRef


@dataclass(frozen=True)
class Published:
    version: AdapterVersion
    deduplicated: bool  # an existing version with the same content, returned instead of a new one


def version_filenames(directory: Path) -> tuple[str, ...]:
    """The files of a staged version: the two PEFT files, and its own chat template if it has one."""
    return ADAPTER_FILES + ((CHAT_TEMPLATE_FILE,) if (directory / CHAT_TEMPLATE_FILE).is_file() else ())


def store_adapter_files(directory: Path, *, store: BlobStore) -> list[StoredFile]:
    return [StoredFile(filename=filename, ref=store.put_file(directory / filename))
            for filename in version_filenames(directory)]


def publish_adapter_dir(
    session: Session,
    *,
    store: BlobStore,
    tenant_id: uuid.UUID,
    adapter_name: str,
    directory: Path,
    base: ServedBase,
    source: AdapterVersionSource,
    training_job_id: str | None,
    actor_key_id: uuid.UUID | None,
) -> Published:
    """Validate the PEFT files in `directory` and register them as the adapter's next version
    (what an upload and a finished training job both end with), unless a version holds them already."""
    check_adapter_name(adapter_name, reserved=base.reserved_names)
    summary = validate_adapter_dir(directory, base=base)
    tool_parser = declared_tool_parser(directory)
    # Checked before storing too, so that a repeated push uploads no blob at all.
    digests = {filename: file_sha256(directory / filename) for filename in version_filenames(directory)}
    existing = same_content_version(session, tenant_id=tenant_id, adapter_name=adapter_name, digests=digests)
    if existing is not None:
        return Published(existing, deduplicated=True)
    with claimed_blobs(session, store, digests.values()):
        files = store_adapter_files(directory, store=store)
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
            tool_parser=tool_parser,
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
    tool_parser: str | None,
) -> Published:
    """Add version N+1 of the adapter (creating the adapter on its first version) and point `latest`
    at it, in one transaction; or return the version that holds the same files already, changing
    nothing (`latest` stays). The files must already be in storage. `tool_parser`: what the adapter_config.json
    among them names (tool_parsers.declared_tool_parser), already checked."""
    attempt = 1
    while True:
        try:
            # Locked like every change to the adapter (versions.find_adapter): `latest`'s history chains.
            adapter = session.scalar(for_update(
                session, select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == adapter_name)
            ))
            if adapter is None:
                _refuse_name_differing_in_case(session, tenant_id=tenant_id, adapter_name=adapter_name)
                adapter = Adapter(tenant_id=tenant_id, name=adapter_name)
                session.add(adapter)
                session.flush()
            else:  # under the adapter's lock: two identical pushes at once make one version
                existing = same_content_version(
                    session, tenant_id=tenant_id, adapter_name=adapter_name,
                    digests={file.filename: file.ref.sha256 for file in files},
                )
                if existing is not None:
                    session.commit()  # releases the lock; nothing was written
                    return Published(existing, deduplicated=True)
            # Deleted versions count: a number, once given, never names other weights.
            highest = session.scalar(
                select(func.max(AdapterVersion.number)).where(AdapterVersion.adapter_id == adapter.id)
            )
            version = AdapterVersion(
                adapter_id=adapter.id,
                number=(highest or 0) + 1,
                status=AdapterVersionStatus.ready,
                base_model=base_model,
                declared_base_model=None if summary.base_model is None else summary.base_model[:MAX_DECLARED_BASE_CHARS],
                rank=summary.rank,
                alpha=summary.alpha,
                target_modules=list(summary.target_modules),
                dtype=summary.dtype,
                tool_parser=tool_parser,
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
            announce_adapter_change(session, tenant_id=tenant_id, adapter_name=adapter_name)
            session.commit()
            return Published(version, deduplicated=False)
        except IntegrityError:  # another upload took this number (or created the adapter) first
            session.rollback()
            if attempt == REGISTER_ATTEMPTS:
                raise
            attempt += 1


def _refuse_name_differing_in_case(session: Session, *, tenant_id: uuid.UUID, adapter_name: str) -> None:
    """Names are unique regardless of case in a tenant (the database's index says so too; this says which)."""
    existing = session.scalar(select(Adapter.name).where(
        Adapter.tenant_id == tenant_id, func.lower(Adapter.name) == adapter_name.lower()
    ))
    if existing is not None:
        raise RegistryConflictError(
            f"name: the adapter {existing!r} exists, and adapter names are unique regardless of case; push to "
            f"{existing!r} or choose another name than {adapter_name!r}"
        )


def same_content_version(
    session: Session, *, tenant_id: uuid.UUID, adapter_name: str, digests: dict[str, str]
) -> AdapterVersion | None:
    """The adapter's lowest-numbered ready version whose files have these sha256 digests, or None.
    Only ready versions count: a deleted one's blobs are gone and its number is never reused.
    The chat template counts too: the same weights with another template (or none) are another version."""
    weights, config = (
        select(AdapterVersionFile.version_id).where(
            AdapterVersionFile.filename == filename, AdapterVersionFile.sha256 == digests[filename]
        )
        for filename in (ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE)
    )
    templated = select(AdapterVersionFile.version_id).where(AdapterVersionFile.filename == CHAT_TEMPLATE_FILE)
    if CHAT_TEMPLATE_FILE in digests:
        template = AdapterVersion.id.in_(templated.where(AdapterVersionFile.sha256 == digests[CHAT_TEMPLATE_FILE]))
    else:
        template = AdapterVersion.id.not_in(templated)
    return session.scalars(
        select(AdapterVersion)
        .join(Adapter, AdapterVersion.adapter_id == Adapter.id)
        .where(
            Adapter.tenant_id == tenant_id,
            Adapter.name == adapter_name,
            AdapterVersion.status == AdapterVersionStatus.ready,
            AdapterVersion.id.in_(weights),
            AdapterVersion.id.in_(config),
            template,
        )
        .order_by(AdapterVersion.number)
        .limit(1)
    ).first()
