"""Uploaded training files (`/v1/files`): validated when uploaded, stored as content-addressed blobs.

A file is checked line by line against the served base's tokenizer and context length
(datasets.py) before anything is stored, so a job never fails late on bad data; the row
keeps the counts the validation found. Any format is accepted (chat, instruction, text for
supervised jobs; preference for DPO): the job checks that its files suit its method.
"""
from __future__ import annotations

import hashlib
import io
import uuid
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraloom.engine import Tokenizer
from loraloom.platform.db.models import FineTuningJob, TrainingFile
from loraloom.platform.db.pages import Page, newest_first
from loraloom.platform.registry.blobs import claimed_blobs, collect_blob
from loraloom.platform.storage import BlobStore, content_key
from loraloom.platform.training.datasets import read_dataset
from loraloom.platform.training.errors import TrainingConflictError, TrainingInputError, TrainingNotFoundError
from loraloom.platform.training.job_state import new_id

FINE_TUNE_PURPOSE = "fine-tune"
FILE_PURPOSES = (FINE_TUNE_PURPOSE,)


def create_file(
    session: Session,
    *,
    store: BlobStore,
    tenant_id: uuid.UUID,
    actor_key_id: uuid.UUID | None,
    filename: str,
    purpose: str,
    stream: BinaryIO,
    max_bytes: int,
    tokenizer: Tokenizer,
    max_seq_len: int,
) -> TrainingFile:
    """Validate and store one JSONL dataset; raises TrainingInputError (a DatasetValidationError
    with the line-numbered report for bad content) and stores nothing when it is refused."""
    if purpose not in FILE_PURPOSES:
        raise TrainingInputError(
            code="invalid_purpose", param="purpose",
            message=f"purpose: {purpose!r} is not supported; use one of {', '.join(FILE_PURPOSES)}",
        )
    data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TrainingInputError(
            code="file_too_large", param="file",
            message=f"file: larger than the limit of {max_bytes} bytes; split the dataset",
        )
    report, examples = read_dataset(data, tokenizer, max_seq_len, param="file")
    assert report.format is not None, "a valid dataset has a format"
    with claimed_blobs(session, store, [hashlib.sha256(data).hexdigest()]):
        ref = store.put_stream(io.BytesIO(data))
        row = TrainingFile(
            id=new_id("file"),
            tenant_id=tenant_id,
            filename=filename or "upload.jsonl",
            purpose=purpose,
            size_bytes=ref.size,
            sha256=ref.sha256,
            format=report.format.value,
            line_count=report.num_lines,
            token_count=report.num_tokens,
            max_example_tokens=max(example.longest_sequence for example in examples),
            created_by_key_id=actor_key_id,
        )
        session.add(row)
        session.commit()
    return row


def find_file(session: Session, *, tenant_id: uuid.UUID, file_id: str) -> TrainingFile:
    row = session.scalar(select(TrainingFile).where(TrainingFile.id == file_id, TrainingFile.tenant_id == tenant_id))
    if row is None:
        raise TrainingNotFoundError(f"No such file: {file_id!r}; GET /v1/files lists yours")
    return row


def list_files(
    session: Session, *, tenant_id: uuid.UUID, limit: int, after: str | None, purpose: str | None
) -> Page[TrainingFile]:
    """Newest first; `after` is the last file id of the previous page."""
    query = select(TrainingFile).where(TrainingFile.tenant_id == tenant_id)
    if purpose is not None:
        query = query.where(TrainingFile.purpose == purpose)
    cursor = None if after is None else find_file(session, tenant_id=tenant_id, file_id=after)
    return newest_first(session, query, TrainingFile, cursor, limit)


def open_file(store: BlobStore, row: TrainingFile) -> BinaryIO:
    return store.open(content_key(row.sha256))


def delete_file(session: Session, *, store: BlobStore, tenant_id: uuid.UUID, file_id: str) -> None:
    """Remove the file, and its blob unless other rows hold the same bytes. A file that an
    unfinished job still reads cannot be deleted until the job ends."""
    row = find_file(session, tenant_id=tenant_id, file_id=file_id)
    reader = session.scalar(
        select(FineTuningJob.id).where(
            (FineTuningJob.training_file == file_id) | (FineTuningJob.validation_file == file_id),
            FineTuningJob.finished_at.is_(None),
        ).limit(1)
    )
    if reader is not None:
        raise TrainingConflictError(
            f"file {file_id} is used by fine-tuning job {reader}, which has not finished; "
            "delete the file once the job ends (or cancel it)"
        )
    sha256 = row.sha256
    session.delete(row)
    session.commit()
    collect_blob(session, store, sha256)  # the same bytes may be another file, an adapter or a checkpoint
