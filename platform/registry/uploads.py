"""The two ways files reach the registry: through the gateway (multipart, plain files or one
archive), or straight to object storage with presigned URLs followed by a "complete" call.
Either way the files are validated before anything is registered (publish.py)."""
from __future__ import annotations

import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from loraloom.platform.db.models import AdapterVersion, AdapterVersionSource
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.publish import StoredFile, all_or_nothing, publish_adapter_dir, register_version
from loraloom.platform.registry.references import check_adapter_name
from loraloom.platform.registry.staging import ADAPTER_FILES, UploadedPart, UploadLimits, stage_adapter_files
from loraloom.platform.registry.validation import ServedBase, validate_adapter_dir
from loraloom.platform.storage import BlobNotFoundError, BlobStore, BlobVerificationError, content_key

UPLOAD_DIR_PREFIX = "loraloom-upload-"


@dataclass(frozen=True)
class PlannedFile:
    filename: str
    size_bytes: int


@dataclass(frozen=True)
class PresignedFile:
    filename: str
    upload_key: str
    url: str
    headers: dict[str, str]
    expires_at: datetime


@dataclass(frozen=True)
class UploadedFile:
    """A presigned upload the client says it finished, with what it declares the bytes to be."""

    filename: str
    upload_key: str
    sha256: str
    size_bytes: int


def upload_version(
    session: Session,
    *,
    store: BlobStore,
    tenant_id: uuid.UUID,
    adapter_name: str,
    parts: Sequence[UploadedPart],
    limits: UploadLimits,
    base: ServedBase,
    allow_base_mismatch: bool,
    actor_key_id: uuid.UUID | None,
) -> AdapterVersion:
    """Register the uploaded files (the two PEFT files or one archive of them) as a new version."""
    check_adapter_name(adapter_name, reserved=base.reserved_names)
    with tempfile.TemporaryDirectory(prefix=UPLOAD_DIR_PREFIX) as workdir:
        stage_adapter_files(parts, Path(workdir), limits=limits)
        return publish_adapter_dir(
            session,
            store=store,
            tenant_id=tenant_id,
            adapter_name=adapter_name,
            directory=Path(workdir),
            base=base,
            allow_base_mismatch=allow_base_mismatch,
            source=AdapterVersionSource.upload,
            training_job_id=None,
            actor_key_id=actor_key_id,
        )


def request_presigned_uploads(
    *,
    store: BlobStore,
    adapter_name: str,
    files: Sequence[PlannedFile],
    limits: UploadLimits,
    base: ServedBase,
    expires_s: int,
) -> list[PresignedFile]:
    """One presigned PUT per PEFT file; the client uploads, then calls complete_presigned_upload."""
    check_adapter_name(adapter_name, reserved=base.reserved_names)
    _check_files(files, limits)
    presigned = []
    for file in files:
        put = store.presigned_put(size=file.size_bytes, expires_s=expires_s)
        if put is None:
            raise UploadRejectedError(
                "files: this server's storage does not take presigned uploads (file:// storage); "
                f"upload the files through POST /v1/adapters/{adapter_name}/versions instead"
            )
        presigned.append(
            PresignedFile(
                filename=file.filename, upload_key=put.upload_key, url=put.url, headers=put.headers,
                expires_at=put.expires_at,
            )
        )
    return presigned


def complete_presigned_upload(
    session: Session,
    *,
    store: BlobStore,
    tenant_id: uuid.UUID,
    adapter_name: str,
    files: Sequence[UploadedFile],
    limits: UploadLimits,
    base: ServedBase,
    allow_base_mismatch: bool,
    actor_key_id: uuid.UUID | None,
) -> AdapterVersion:
    """Verify each uploaded file's size and sha256, validate the adapter, then register it.
    A failure at any point deletes the uploads and leaves no row and no new blob."""
    check_adapter_name(adapter_name, reserved=base.reserved_names)
    _check_files(files, limits)
    pending = {file.upload_key for file in files}
    try:
        with all_or_nothing(store) as new_blobs, tempfile.TemporaryDirectory(prefix=UPLOAD_DIR_PREFIX) as workdir:
            stored = []
            for file in files:
                key = _declared_content_key(file)
                existed = store.exists(key)
                pending.discard(file.upload_key)  # complete_upload consumes it, verified or not
                ref = store.complete_upload(file.upload_key, sha256=file.sha256, size=file.size_bytes)
                new_blobs.note(ref.key, existed=existed)
                store.get_to_path(ref.key, Path(workdir) / file.filename)
                stored.append(StoredFile(filename=file.filename, ref=ref))
            summary = validate_adapter_dir(Path(workdir), base=base, allow_base_mismatch=allow_base_mismatch)
            return register_version(
                session,
                tenant_id=tenant_id,
                adapter_name=adapter_name,
                summary=summary,
                files=stored,
                base_model=base.name,
                source=AdapterVersionSource.upload,
                training_job_id=None,
                actor_key_id=actor_key_id,
            )
    except (BlobNotFoundError, BlobVerificationError) as error:
        raise UploadRejectedError(f"files: {error}") from error
    finally:
        for upload_key in pending:
            store.abort_upload(upload_key)


def _declared_content_key(file: UploadedFile) -> str:
    try:
        return content_key(file.sha256)
    except ValueError:
        raise UploadRejectedError(
            f"files: sha256 of {file.filename} must be 64 lowercase hex digits, got {file.sha256!r}"
        ) from None


def _check_files(files: Sequence[PlannedFile | UploadedFile], limits: UploadLimits) -> None:
    filenames = [file.filename for file in files]
    if sorted(filenames) != sorted(ADAPTER_FILES):
        raise UploadRejectedError(
            f"files: expected exactly {ADAPTER_FILES[0]} and {ADAPTER_FILES[1]} (archives go through "
            f"POST /v1/adapters/{{name}}/versions), got {filenames}"
        )
    total = sum(file.size_bytes for file in files)
    if total > limits.max_total_bytes:
        raise UploadRejectedError(f"files: {total} bytes in all exceed this server's limit of {limits.max_total_bytes}")
