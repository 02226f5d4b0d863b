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

from loraloom.engine import AdapterSummary, file_sha256

from loraloom.platform.db.models import AdapterVersionSource
from loraloom.platform.registry.errors import UploadRejectedError
from loraloom.platform.registry.blobs import claimed_blobs, collect_blob
from loraloom.platform.registry.chat_templates import gather_chat_template
from loraloom.platform.registry.publish import (
    Published,
    StoredFile,
    publish_adapter_dir,
    register_version,
    version_filenames,
)
from loraloom.platform.registry.references import check_adapter_name
from loraloom.platform.registry.staging import (
    ADAPTER_FILES,
    TEMPLATE_FILES,
    UploadedPart,
    UploadLimits,
    stage_adapter_files,
)
from loraloom.platform.registry.tool_parsers import declared_tool_parser
from loraloom.platform.registry.validation import ServedBase, validate_adapter_dir
from loraloom.platform.storage import BlobNotFoundError, BlobRef, BlobStore, BlobVerificationError, content_key

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
    """One presigned PUT per file (the two PEFT files and the chat template's, as _check_files takes them); the
    client uploads, then calls complete_presigned_upload."""
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
    A failure at any point deletes the uploads and leaves no row and no new blob.

    The template is gathered as a direct upload's is (chat_templates.gather_chat_template): kept as
    chat_template.jinja, which is stored from the staging folder when it came inside tokenizer_config.json;
    the uploaded tokenizer_config.json is no file of the version, and its blob goes once the version is in."""
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
            directory = Path(workdir)
            uploaded = {}
            for file in files:
                pending.discard(file.upload_key)  # complete_upload consumes it, verified or not
                uploaded[file.filename] = store.complete_upload(file.upload_key, sha256=file.sha256,
                                                                size=file.size_bytes)
                store.get_to_path(uploaded[file.filename].key, directory / file.filename)
            summary = validate_adapter_dir(directory, base=target.base)
            gather_chat_template(directory)
            tool_parser = declared_tool_parser(directory)
            published = _register_staged(session, target, directory, uploaded, summary, tool_parser)
    except (BlobNotFoundError, BlobVerificationError) as error:
        raise UploadRejectedError(f"files: {error}") from error
    finally:
        for upload_key in pending:
            _abort_quietly(store, upload_key)
    kept = {file.filename for file in published.version.files}
    for filename, ref in uploaded.items():
        if filename not in kept:  # tokenizer_config.json: read for its template, not kept
            _collect_quietly(session, store, ref.sha256)
    return published


def _register_staged(
    session: Session, target: UploadTarget, directory: Path, uploaded: dict[str, BlobRef], summary: AdapterSummary,
    tool_parser: str | None,
) -> Published:
    """Register the version's files in `directory`: those uploaded as they are stored already, a file made
    here (the template taken out of tokenizer_config.json) stored now, under a claim of its own."""
    made = [filename for filename in version_filenames(directory) if filename not in uploaded]
    with claimed_blobs(session, target.store, (file_sha256(directory / filename) for filename in made)):
        stored = [StoredFile(filename=filename, ref=uploaded[filename] if filename in uploaded
                             else target.store.put_file(directory / filename))
                  for filename in version_filenames(directory)]
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
            tool_parser=tool_parser,
        )


def _abort_quietly(store: BlobStore, upload_key: str) -> None:
    """Cleanup after a completion: a failure here is logged, never raised, since raising would
    replace the error the client must see (why its upload was refused) with a 500."""
    try:
        store.abort_upload(upload_key)
    except Exception:
        logger.exception("could not discard presigned upload %s; object storage keeps it until its lifecycle rule", upload_key)


def _collect_quietly(session: Session, store: BlobStore, sha256: str) -> None:
    """The version is registered: failing to delete a file it does not keep must not fail the push."""
    try:
        collect_blob(session, store, sha256)
    except Exception:
        session.rollback()
        logger.exception("could not delete blob %s, uploaded but not kept; it stays until deleted by hand", sha256)


def _check_declared_sha256(file: UploadedFile) -> None:
    try:
        content_key(file.sha256)  # the one place that knows what a blob digest looks like
    except ValueError:
        raise UploadRejectedError(
            f"files: sha256 of {file.filename} must be 64 lowercase hex digits, got {file.sha256!r}"
        ) from None


def _check_files(files: Sequence[PlannedFile | UploadedFile], limits: UploadLimits) -> None:
    """The files a direct upload takes (staging.py), each once: the two PEFT files, and the adapter's chat
    template as chat_template.jinja or tokenizer_config.json (or both: chat_template.jinja wins)."""
    filenames = [file.filename for file in files]
    named = set(filenames)
    if len(named) != len(filenames) or not set(ADAPTER_FILES) <= named <= {*ADAPTER_FILES, *TEMPLATE_FILES}:
        raise UploadRejectedError(
            f"files: expected exactly {ADAPTER_FILES[0]} and {ADAPTER_FILES[1]}, each once, and the adapter's chat "
            f"template ({' or '.join(TEMPLATE_FILES)}) if it has its own (archives go through "
            f"POST /v1/adapters/{{name}}/versions), got {filenames}"
        )
    total = sum(file.size_bytes for file in files)
    if total > limits.max_total_bytes:
        raise UploadRejectedError(f"files: {total} bytes in all exceed this server's limit of {limits.max_total_bytes}")
