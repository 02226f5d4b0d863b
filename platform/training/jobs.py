"""Fine-tuning jobs as the API sees them: create (checks everything a worker would refuse
later), list, retrieve, cancel, and the job's events and checkpoints.

Lists are newest first with OpenAI's cursor: `after` is the last id of the previous page.
Events may also be read oldest first (`order="asc"`), which is how a follower tails them.
"""
from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from loraloom.platform.db.models import (
    MAX_INT64,
    FineTuningCheckpoint,
    FineTuningJob,
    FineTuningJobEvent,
    FineTuningJobStatus,
    TrainingFile,
    utcnow,
)
from loraloom.platform.db.pages import Page, fetch_page, newest_first
from loraloom.platform.registry.references import check_adapter_name
from loraloom.platform.storage import BlobStore
from loraloom.platform.training import start_checkpoint
from loraloom.platform.training.errors import TrainingConflictError, TrainingInputError, TrainingNotFoundError
from loraloom.platform.training.files import FINE_TUNE_PURPOSE, find_file
from loraloom.platform.training.hyperparameters import Hyperparameters, check_rank_is_served
from loraloom.platform.training.job_options import check_early_stopping
from loraloom.platform.training.job_state import SYSTEM_ERROR, add_event, new_id
from loraloom.platform.training.methods import SUPERVISED, check_file_method
from loraloom.platform.training.promotion import Promotion, check_promotion

EVENT_ID_PREFIX = "ftevent-"
# An event cursor: an event id, or its number (at most MAX_INT64, which no pattern states).
EVENT_CURSOR = re.compile(r"(?:ftevent-)?[0-9]{1,19}")
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class ServedModel:
    """What a job must fit: the base the engine serves and its largest LoRA rank."""

    name: str
    max_lora_rank: int
    reserved_names: frozenset[str]


BASE_NAME = "base"  # what requests call the served base (registry/references.py ALWAYS_BASE_NAMES)


def generated_suffix() -> str:
    """The adapter name of a job created without a suffix: 32 random bits, so two such jobs do not become
    versions of one adapter (a collision would only add a version, never overwrite one)."""
    return f"ft-{secrets.token_hex(4)}"


def create_job(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    actor_key_id: uuid.UUID | None,
    served: ServedModel,
    model: str,
    training_file: str,
    validation_file: str | None,
    suffix: str | None,
    seed: int | None,
    hyperparameters: Hyperparameters,
    max_attempts: int,
    send: Callable[[str], None],
    method: str = SUPERVISED,
    metadata: dict[str, str] | None = None,
    early_stopping_patience: int | None = None,
    from_checkpoint: str | None = None,
    store: BlobStore | None = None,
    promote: Promotion | None = None,
) -> FineTuningJob:
    """Check the request against the files and the served base, add the job as queued and send it
    to the workers. Raises TrainingInputError naming the field at fault. `model` may also be `base`, as in
    requests; the job records the served name. No `suffix`: a new name is generated. `hyperparameters` are
    the `method`'s (job_options.choose_hyperparameters); `store` reads a `from_checkpoint`'s adapter config.
    `promote`: the alias of `suffix` the job moves to its version on success (promotion.py)."""
    if suffix is None:
        suffix = generated_suffix()
    check_job_inputs(session, tenant_id=tenant_id, served=served, model=model, training_file=training_file,
                     validation_file=validation_file, suffix=suffix, hyperparameters=hyperparameters, method=method,
                     early_stopping_patience=early_stopping_patience, from_checkpoint=from_checkpoint, store=store,
                     promote=promote)
    job = FineTuningJob(
        id=new_id("ftjob"),
        tenant_id=tenant_id,
        created_by_key_id=actor_key_id,
        model=served.name,
        training_file=training_file,
        validation_file=validation_file,
        suffix=suffix,
        seed=seed if seed is not None else secrets.randbelow(MAX_SEED),
        hyperparameters=hyperparameters.model_dump(),
        method=method,
        job_metadata=metadata,
        early_stopping_patience=early_stopping_patience,
        from_checkpoint=from_checkpoint,
        promote_alias=None if promote is None else promote.alias,
        promote_when=None if promote is None else promote.when,
        status=FineTuningJobStatus.queued,
        max_attempts=max_attempts,
    )
    session.add(job)
    session.flush()
    add_event(session, job.id, "Validated the training files; the job is queued")
    session.commit()
    try:
        send(job.id)
    except Exception as error:  # the broker is unreachable: say so rather than leave the job queued for ever
        fail_unsent(session, job, error)
    return job


def check_job_inputs(
    session: Session, *, tenant_id: uuid.UUID, served: ServedModel, model: str, training_file: str,
    validation_file: str | None, suffix: str | None, hyperparameters: Hyperparameters, method: str,
    early_stopping_patience: int | None, from_checkpoint: str | None, store: BlobStore | None,
    promote: Promotion | None = None,
) -> list[TrainingFile]:
    """Everything a worker would refuse later, checked now (creating a job and estimating one check
    the same): the base, the adapter name, the rank, the promotion, the files (the caller's, of the
    method's format) and the start checkpoint. Returns the files' rows, training file first."""
    if model not in (BASE_NAME, served.name):
        raise TrainingInputError(
            code="model_not_available", param="model",
            message=f"model: {model!r} cannot be fine-tuned here; this server trains adapters for {served.name!r} "
                    f"(or send {BASE_NAME!r})",
        )
    if suffix is not None:
        try:
            check_adapter_name(suffix, reserved=served.reserved_names)
        except ValueError as error:
            raise TrainingInputError(code="invalid_suffix", param="suffix",
                                     message=str(error).replace("name: ", "suffix: ", 1)) from None
    check_rank_is_served(hyperparameters, served.max_lora_rank)
    check_early_stopping(early_stopping_patience, validation_file)
    check_promotion(promote, validation_file)
    rows = [_check_file(session, tenant_id, param, file_id, hyperparameters.max_seq_len, method)
            for param, file_id in (("training_file", training_file), ("validation_file", validation_file))
            if file_id is not None]
    if from_checkpoint is not None:
        if store is None:
            raise ValueError("check_job_inputs: a from_checkpoint needs the blob store to read its adapter config")
        checkpoint = find_checkpoint(session, tenant_id=tenant_id, checkpoint_id=from_checkpoint)
        if checkpoint is None:
            raise start_checkpoint.not_found(from_checkpoint)
        start_checkpoint.check_base(checkpoint, session.get(FineTuningJob, checkpoint.job_id).model, served.name)
        start_checkpoint.check_fits(store, checkpoint, hyperparameters)
    return rows


def _check_file(
    session: Session, tenant_id: uuid.UUID, param: str, file_id: str, max_seq_len: int, method: str
) -> TrainingFile:
    try:
        row = find_file(session, tenant_id=tenant_id, file_id=file_id)
    except TrainingNotFoundError:
        raise TrainingInputError(code="file_not_found", param=param,
                                 message=f"{param}: no file {file_id!r}; upload it with POST /v1/files") from None
    if row.purpose != FINE_TUNE_PURPOSE:
        raise TrainingInputError(
            code="invalid_file_purpose", param=param,
            message=f"{param}: file {file_id} has purpose {row.purpose!r}; upload it with purpose {FINE_TUNE_PURPOSE!r}",
        )
    if row.max_example_tokens > max_seq_len:
        raise TrainingInputError(
            code="invalid_hyperparameters", param="hyperparameters.max_seq_len",
            message=f"hyperparameters.max_seq_len: {param} {file_id} has an example of {row.max_example_tokens} "
                    f"tokens, above max_seq_len {max_seq_len}; raise max_seq_len or shorten the example",
        )
    check_file_method(row.format, method, param)
    return row


def fail_unsent(session: Session, job: FineTuningJob, error: Exception) -> None:
    message = f"The job could not be sent to the training queue ({type(error).__name__}: {error}); create it again"
    session.execute(
        update(FineTuningJob)
        .where(FineTuningJob.id == job.id, FineTuningJob.status == FineTuningJobStatus.queued)
        .values(status=FineTuningJobStatus.failed, error_code=SYSTEM_ERROR, error_message=message,
                finished_at=utcnow())
    )
    add_event(session, job.id, message, level="error")
    session.commit()
    session.refresh(job)


def find_job(session: Session, *, tenant_id: uuid.UUID, job_id: str) -> FineTuningJob:
    job = session.scalar(select(FineTuningJob).where(FineTuningJob.id == job_id, FineTuningJob.tenant_id == tenant_id))
    if job is None:
        raise TrainingNotFoundError(f"No such fine-tuning job: {job_id!r}; GET /v1/fine_tuning/jobs lists yours")
    return job


def list_jobs(session: Session, *, tenant_id: uuid.UUID, limit: int, after: str | None) -> Page[FineTuningJob]:
    query = select(FineTuningJob).where(FineTuningJob.tenant_id == tenant_id)
    cursor = None if after is None else find_job(session, tenant_id=tenant_id, job_id=after)
    return newest_first(session, query, FineTuningJob, cursor, limit)


Transition = tuple[FineTuningJobStatus, FineTuningJobStatus, str]  # (from, to, the event's message)


def move_job(session: Session, job: FineTuningJob, transitions: tuple[Transition, ...]) -> bool:
    """The first transition whose `from` is the job's status now, as a compare-and-set; commits it with
    its event. False when none applies (the caller says why from the refreshed job)."""
    for current, new, message in transitions:
        values = {"status": new, **({"finished_at": utcnow()} if new.finished else {})}
        moved = session.execute(
            update(FineTuningJob).where(FineTuningJob.id == job.id, FineTuningJob.status == current).values(**values)
        ).rowcount
        if moved:
            add_event(session, job.id, message)
            session.commit()
            session.refresh(job)
            return True
    session.refresh(job)
    return False


def cancel_job(session: Session, *, tenant_id: uuid.UUID, job_id: str) -> FineTuningJob:
    """A queued or paused job is cancelled at once; a running one (or one pausing) is asked to stop
    (cancel_requested), and its worker saves a checkpoint and ends it `cancelled` at the next step."""
    job = find_job(session, tenant_id=tenant_id, job_id=job_id)
    transitions = (
        (FineTuningJobStatus.validating_files, FineTuningJobStatus.cancelled, "The job was cancelled before it ran"),
        (FineTuningJobStatus.queued, FineTuningJobStatus.cancelled, "The job was cancelled before it ran"),
        (FineTuningJobStatus.paused, FineTuningJobStatus.cancelled, "The paused job was cancelled"),
        (FineTuningJobStatus.running, FineTuningJobStatus.cancel_requested,
         "Cancellation requested; the job stops after its current step"),
        (FineTuningJobStatus.pause_requested, FineTuningJobStatus.cancel_requested,
         "Cancellation requested; the job stops after its current step"),
    )
    if move_job(session, job, transitions) or job.status is FineTuningJobStatus.cancel_requested:
        return job
    raise TrainingConflictError(f"fine-tuning job {job_id} has already {job.status.value}; there is nothing to cancel")


def list_events(
    session: Session, *, tenant_id: uuid.UUID, job_id: str, limit: int, after: str | None,
    order: Literal["asc", "desc"],
) -> Page[FineTuningJobEvent]:
    find_job(session, tenant_id=tenant_id, job_id=job_id)
    query = select(FineTuningJobEvent).where(FineTuningJobEvent.job_id == job_id)
    if after is not None:
        cursor = parse_event_id(after)
        query = query.where(FineTuningJobEvent.id > cursor if order == "asc" else FineTuningJobEvent.id < cursor)
    ordering = FineTuningJobEvent.id.asc() if order == "asc" else FineTuningJobEvent.id.desc()
    return fetch_page(session, query.order_by(ordering), limit)


def event_id(event: FineTuningJobEvent) -> str:
    return f"{EVENT_ID_PREFIX}{event.id}"


def parse_event_id(value: str) -> int:
    # No event id is larger than MAX_INT64; SQLite would overflow.
    if EVENT_CURSOR.fullmatch(value) is None or int(value.removeprefix(EVENT_ID_PREFIX)) > MAX_INT64:
        raise TrainingInputError(code="invalid_cursor", param="after",
                                 message=f"after: {value!r} is not an event id (ftevent-<number>)")
    return int(value.removeprefix(EVENT_ID_PREFIX))


def list_checkpoints(
    session: Session, *, tenant_id: uuid.UUID, job_id: str, limit: int, after: str | None
) -> Page[FineTuningCheckpoint]:
    find_job(session, tenant_id=tenant_id, job_id=job_id)
    query = select(FineTuningCheckpoint).where(FineTuningCheckpoint.job_id == job_id)
    cursor = None
    if after is not None:
        cursor = session.scalar(query.where(FineTuningCheckpoint.id == after))
        if cursor is None:
            raise TrainingNotFoundError(f"No such checkpoint of job {job_id}: {after!r}")
    return newest_first(session, query, FineTuningCheckpoint, cursor, limit)


def find_checkpoint(session: Session, *, tenant_id: uuid.UUID, checkpoint_id: str) -> FineTuningCheckpoint | None:
    """The tenant's checkpoint with this id (a reference the gateway can serve), or None."""
    return session.scalar(
        select(FineTuningCheckpoint)
        .join(FineTuningJob, FineTuningJob.id == FineTuningCheckpoint.job_id)
        .where(FineTuningCheckpoint.id == checkpoint_id, FineTuningJob.tenant_id == tenant_id)
    )
