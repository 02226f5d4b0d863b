"""The two ways files reach the registry: through the gateway (multipart, plain files or one
archive), or straight to object storage with presigned URLs followed by a "complete" call.
Either way the files are validated before anything is registered (publish.py)."""
from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from loraloom.platform.db.models import AdapterVersionSource
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.blobs import claimed_blobs
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE, check_uploaded_template
from loraloom.platform.registry.publish import Published, StoredFile, publish_adapter_dir, register_version
from loraloom.platform.registry.references import check_adapter_name
from loraloom.platform.registry.staging import ADAPTER_FILES, UploadedPart, UploadLimits, stage_adapter_files
from loraloom.platform.registry.validation import ServedBase, validate_adapter_dir
from loraloom.platform.storage import BlobNotFoundError, BlobStore, BlobVerificationError, content_key

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class UploadTarget:
    """What both ways of pushing a version share: which tenant's adapter, who pushes it, where its files
    are staged and stored, and what they must fit. RegistryService builds one per push."""

    store: BlobStore
    staging_dir: Path  # each upload is unpacked in a folder of its own here
    limits: UploadLimits
    base: ServedBase
    tenant_id: uuid.UUID
    adapter_name: str
    actor_key_id: uuid.UUID | None


def upload_version(session: Session, target: UploadTarget, parts: Sequence[UploadedPart]) -> Published:
    """Register the uploaded files (the two PEFT files or one archive of them) as a new version, or
    return the version holding them already."""
    base = target.base
    check_adapter_name(target.adapter_name, reserved=base.reserved_names)
    with tempfile.TemporaryDirectory(prefix=UPLOAD_DIR_PREFIX, dir=target.staging_dir) as workdir:
        limits = target.limits.for_base(base.largest_upload_bytes, base.max_lora_rank)
        stage_adapter_files(parts, Path(workdir), limits=limits)
        return publish_adapter_dir(
            session,
            store=target.store,
            tenant_id=target.tenant_id,
            adapter_name=target.adapter_name,
            directory=Path(workdir),
            base=base,
            source=AdapterVersionSource.upload,
            training_job_id=None,
            actor_key_id=target.actor_key_id,
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


def complete_presigned_upload(session: Session, target: UploadTarget, files: Sequence[UploadedFile]) -> Published:
    """Verify each uploaded file's size and sha256, validate the adapter, then register it.
    A failure at any point deletes the uploads and leaves no row and no new blob."""
    store = target.store
    check_adapter_name(target.adapter_name, reserved=target.base.reserved_names)
    _check_files(files, target.limits)
    for file in files:
        _check_declared_sha256(file)  # a malformed digest is refused before it is claimed
    pending = {file.upload_key for file in files}
    try:
        with claimed_blobs(session, store, (file.sha256 for file in files)), tempfile.TemporaryDirectory(
            prefix=UPLOAD_DIR_PREFIX, dir=target.staging_dir
        ) as workdir:
            stored = []
            for file in files:
                pending.discard(file.upload_key)  # complete_upload consumes it, verified or not
                ref = store.complete_upload(file.upload_key, sha256=file.sha256, size=file.size_bytes)
                store.get_to_path(ref.key, Path(workdir) / file.filename)
                stored.append(StoredFile(filename=file.filename, ref=ref))
            summary = validate_adapter_dir(Path(workdir), base=target.base)
            check_uploaded_template(Path(workdir))
            return register_version(
                session,
                tenant_id=target.tenant_id,
                adapter_name=target.adapter_name,
                summary=summary,
                files=stored,
                base_model=target.base.name,
                source=AdapterVersionSource.upload,
                training_job_id=None,
                actor_key_id=target.actor_key_id,
            )
    except (BlobNotFoundError, BlobVerificationError) as error:
        raise UploadRejectedError(f"files: {error}") from error
    finally:
        for upload_key in pending:
            _abort_quietly(store, upload_key)


def _abort_quietly(store: BlobStore, upload_key: str) -> None:
    """Cleanup after a completion: a failure here is logged, never raised, since raising would
    replace the error the client must see (why its upload was refused) with a 500."""
    try:
        store.abort_upload(upload_key)
    except Exception:
        logger.exception("could not discard presigned upload %s; object storage keeps it until its lifecycle rule", upload_key)


def _check_declared_sha256(file: UploadedFile) -> None:
    try:
        content_key(file.sha256)  # the one place that knows what a blob digest looks like
    except ValueError:
        raise UploadRejectedError(
            f"files: sha256 of {file.filename} must be 64 lowercase hex digits, got {file.sha256!r}"
        ) from None


def _check_files(files: Sequence[PlannedFile | UploadedFile], limits: UploadLimits) -> None:
    filenames = [file.filename for file in files]
    if sorted(filenames) not in (sorted(ADAPTER_FILES), sorted((*ADAPTER_FILES, CHAT_TEMPLATE_FILE))):
        raise UploadRejectedError(
            f"files: expected exactly {ADAPTER_FILES[0]} and {ADAPTER_FILES[1]}, and {CHAT_TEMPLATE_FILE} if the "
            f"adapter has its own chat template (archives and tokenizer_config.json go through "
            f"POST /v1/adapters/{{name}}/versions), got {filenames}"
        )
    total = sum(file.size_bytes for file in files)
    if total > limits.max_total_bytes:
        raise UploadRejectedError(f"files: {total} bytes in all exceed this server's limit of {limits.max_total_bytes}")
