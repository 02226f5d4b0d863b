"""A fine-tuning job's life in the database, as compare-and-set transitions.

    queued --claim--> running --finish--> succeeded | failed | cancelled
                         |  \\--cancel--> cancel_requested --finish--> cancelled
                         |  \\--pause---> pause_requested --finish--> paused
                         \\--heartbeat stale, or a system fault--> queued again (bounded) | failed
    queued --pause--> paused;  paused | failed | cancelled --resume--> queued (lifecycle.py)

`paused` is a rest state: no worker holds the job and no reaper looks at it; a run that dies
while its pause is pending ends the job paused, as a run whose cancel is pending ends it cancelled.

Every transition is one UPDATE whose WHERE clause states the status it expects, so two
processes racing for a job (a redelivered message, two reapers, a cancel during a claim)
cannot both win. A claim hands out a fresh `run_token`; the worker's later writes
(heartbeats, checkpoints, the end of the run) name it, so a run whose job was requeued
behind its back can no longer change the job.
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.db.models import (
    FineTuningCheckpoint,
    FineTuningJob,
    FineTuningJobEvent,
    FineTuningJobStatus,
    utcnow,
)
from loraloom.platform.training.dispatch import ACTIVE, dispatchable_job_ids, lock_claims, next_job

# Codes of the errors the system (not the user's input) is to blame for.
WORKER_LOST = "worker_lost"
SYSTEM_ERROR = "system_error"

logger = logging.getLogger(__name__)
# An event's level (the API's "info" | "warn" | "error") as a log level.
EVENT_LOG_LEVELS = {"info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class LostOwnershipError(RuntimeError):
    """The job was taken from this run (requeued after a missed heartbeat): stop, write nothing."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class Claim:
    job_id: str
    run_token: str
    attempt: int
    worker_id: str


def add_event(
    session: Session, job_id: str, message: str, *, level: str = "info", type: str = "message",
    data: dict[str, Any] | None = None,
) -> None:
    session.add(FineTuningJobEvent(job_id=job_id, level=level, type=type, message=message, data=data))
    # The worker's log tells the same story as the job's events, each line naming the job.
    logger.log(EVENT_LOG_LEVELS.get(level, logging.INFO), "job %s: %s", job_id, message,
               extra={"job_id": job_id, "event_type": type, **({"data": data} if data else {})})


def claim_job(factory: sessionmaker[Session], job_id: str, worker_id: str) -> Claim | None:
    """queued -> running for this worker; None when the job is not queued (already running
    elsewhere, finished, cancelled, or unknown): the message that asked for it is stale."""
    with factory.begin() as session:
        return _claim(session, job_id, worker_id)


def claim_next_job(factory: sessionmaker[Session], worker_id: str) -> Claim | None:
    """Claim the job whose turn it is (dispatch.py: fair across tenants, within their limits);
    None when no queued job may run now."""
    with factory.begin() as session:
        lock_claims(session)
        job_id = next_job(session)
        return None if job_id is None else _claim(session, job_id, worker_id)


def _claim(session: Session, job_id: str, worker_id: str) -> Claim | None:
    token = secrets.token_hex(16)
    now = utcnow()
    claimed = session.execute(
        update(FineTuningJob)
        .where(FineTuningJob.id == job_id, FineTuningJob.status == FineTuningJobStatus.queued)
        .values(
            status=FineTuningJobStatus.running,
            run_token=token,
            worker_id=worker_id,
            heartbeat_at=now,
            attempts=FineTuningJob.attempts + 1,
            started_at=now,
        )
    ).rowcount
    if not claimed:
        return None
    attempt = session.scalar(select(FineTuningJob.attempts).where(FineTuningJob.id == job_id))
    add_event(session, job_id, f"Fine-tuning job started (attempt {attempt}, worker {worker_id})",
              data={"attempt": attempt, "worker_id": worker_id})
    return Claim(job_id=job_id, run_token=token, attempt=attempt, worker_id=worker_id)


def _owned(claim: Claim):
    return (FineTuningJob.id == claim.job_id) & (FineTuningJob.run_token == claim.run_token) & (
        FineTuningJob.status.in_(ACTIVE)
    )


def record_step(factory: sessionmaker[Session], claim: Claim, message: str, metrics: dict[str, Any]) -> None:
    """One step's metrics: its event, and the job's `metrics` while this run holds the job, so that a
    jobs list reads each job's progress (step of total, ETA, tokens/s) from the job row itself."""
    with factory.begin() as session:
        add_event(session, claim.job_id, message, type="metrics", data=metrics)
        session.execute(update(FineTuningJob).where(_owned(claim)).values(metrics=metrics))


def beat(factory: sessionmaker[Session], claim: Claim) -> bool:
    """Write a heartbeat; False when the job is no longer this run's."""
    with factory.begin() as session:
        return bool(session.execute(update(FineTuningJob).where(_owned(claim)).values(heartbeat_at=utcnow())).rowcount)


STOP_REQUESTS = (FineTuningJobStatus.cancel_requested, FineTuningJobStatus.pause_requested)


def stop_request(factory: sessionmaker[Session], claim: Claim) -> FineTuningJobStatus | None:
    """Asked between steps: has the user cancelled or paused the job? The request's status, or None.
    Raises LostOwnershipError if the job was taken away."""
    with factory() as session:
        row = session.execute(
            select(FineTuningJob.status, FineTuningJob.run_token).where(FineTuningJob.id == claim.job_id)
        ).one_or_none()
    if row is None or row.run_token != claim.run_token or row.status not in ACTIVE:
        raise LostOwnershipError(f"job {claim.job_id} is no longer owned by this run")
    return row.status if row.status in STOP_REQUESTS else None


def cancel_requested(factory: sessionmaker[Session], claim: Claim) -> bool:
    """Asked between steps: is the run to stop (cancelled or paused)?"""
    return stop_request(factory, claim) is not None


def record_checkpoint(
    factory: sessionmaker[Session], claim: Claim, *, step: int, metrics: dict[str, Any], config_sha256: str,
    weights_sha256: str, weights_size_bytes: int, training_state_sha256: str | None,
) -> str | None:
    """Add a checkpoint row (its blobs are already stored); None when the run lost the job.

    A job has one checkpoint per step. A run that could not resume (its job's checkpoints predate
    training states) trains the same steps again: its checkpoint replaces the earlier run's."""
    with factory.begin() as session:
        if session.scalar(select(FineTuningJob.id).where(_owned(claim))) is None:
            return None
        values = dict(metrics=metrics, config_sha256=config_sha256, weights_sha256=weights_sha256,
                      weights_size_bytes=weights_size_bytes, training_state_sha256=training_state_sha256)
        checkpoint_id = session.scalar(select(FineTuningCheckpoint.id).where(
            FineTuningCheckpoint.job_id == claim.job_id, FineTuningCheckpoint.step == step))
        if checkpoint_id is None:
            checkpoint_id = new_id("ftckpt")
            session.add(FineTuningCheckpoint(id=checkpoint_id, job_id=claim.job_id, step=step, **values))
        else:
            session.execute(update(FineTuningCheckpoint).where(FineTuningCheckpoint.id == checkpoint_id).values(**values))
        add_event(session, claim.job_id, f"Checkpoint {checkpoint_id} saved at step {step}",
                  data={"checkpoint": checkpoint_id, "step": step})
    return checkpoint_id


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a new run of a job continues from: its latest one with a training state."""

    checkpoint_id: str
    step: int
    metrics: dict[str, Any]
    config_sha256: str
    weights_sha256: str
    training_state_sha256: str


def resume_point(factory: sessionmaker[Session], job_id: str) -> ResumePoint | None:
    with factory() as session:
        checkpoint = session.scalar(
            select(FineTuningCheckpoint)
            .where(FineTuningCheckpoint.job_id == job_id, FineTuningCheckpoint.training_state_sha256.is_not(None))
            .order_by(FineTuningCheckpoint.step.desc())
            .limit(1)
        )
        if checkpoint is None:
            return None
        return ResumePoint(
            checkpoint_id=checkpoint.id, step=checkpoint.step, metrics=dict(checkpoint.metrics),
            config_sha256=checkpoint.config_sha256, weights_sha256=checkpoint.weights_sha256,
            training_state_sha256=checkpoint.training_state_sha256,
        )


def set_checkpoint_metrics(factory: sessionmaker[Session], checkpoint_id: str, metrics: dict[str, Any]) -> None:
    """The trainer saves a checkpoint before it reports that step's metrics: they are filled in after."""
    with factory.begin() as session:
        session.execute(update(FineTuningCheckpoint).where(FineTuningCheckpoint.id == checkpoint_id)
                        .values(metrics=metrics))


def finish_job(
    session: Session, claim: Claim, status: FineTuningJobStatus, *, message: str, level: str = "info",
    error: tuple[str, str, str | None] | None = None, **fields: Any,
) -> bool:
    """End the run in `session`'s transaction (the caller commits): the job becomes `status`.
    `error` is (code, message, param). False when the job is no longer this run's."""
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "run_token": None, **fields}
    if error is not None:
        values.update(error_code=error[0], error_message=error[1], error_param=error[2])
    if not session.execute(update(FineTuningJob).where(_owned(claim)).values(**values)).rowcount:
        return False
    add_event(session, claim.job_id, message, level=level)
    return True


def requeue_or_fail(
    session: Session, job: FineTuningJob, *, reason: str, error_code: str, send: Callable[[str], None],
    expected_token: str | None,
) -> FineTuningJobStatus | None:
    """A run ended without finishing its job (its worker died, or a system fault): queue the job
    again while attempts remain, else fail it naming `reason`; a job whose cancel was pending
    ends cancelled, one whose pause was pending paused. Commits. None when someone else moved the job first."""
    if job.status is FineTuningJobStatus.cancel_requested:
        new_status, level, message = FineTuningJobStatus.cancelled, "warn", f"{reason}; the job is cancelled"
        values: dict[str, Any] = {"finished_at": utcnow()}
    elif job.status is FineTuningJobStatus.pause_requested:
        new_status, level = FineTuningJobStatus.paused, "warn"
        message = f"{reason}; the job is paused (resume it to continue from its last checkpoint)"
        values = {"heartbeat_at": None, "worker_id": None}
    elif job.attempts < job.max_attempts:
        new_status, level = FineTuningJobStatus.queued, "warn"
        message = f"{reason}; requeued (attempt {job.attempts} of {job.max_attempts} failed)"
        values = {"heartbeat_at": None, "worker_id": None}
    else:
        new_status, level = FineTuningJobStatus.failed, "error"
        message = f"{reason}; failed after {job.attempts} attempt(s), the most allowed"
        values = {"finished_at": utcnow(), "error_code": error_code, "error_message": message, "error_param": None}
    moved = session.execute(
        update(FineTuningJob)
        .where(FineTuningJob.id == job.id, FineTuningJob.status == job.status,
               FineTuningJob.run_token == expected_token)
        .values(status=new_status, run_token=None, **values)
    ).rowcount
    if not moved:
        session.rollback()
        return None
    add_event(session, job.id, message, level=level)
    session.commit()
    if new_status is FineTuningJobStatus.queued:
        send(job.id)
    return new_status


def reap_stale_jobs(
    factory: sessionmaker[Session], *, heartbeat_timeout_s: float, send: Callable[[str], None]
) -> list[tuple[str, FineTuningJobStatus]]:
    """Requeue (or fail) every running job whose worker has not written a heartbeat for
    `heartbeat_timeout_s`: a job is never left `running` by a dead worker."""
    cutoff = utcnow() - timedelta(seconds=heartbeat_timeout_s)
    reaped = []
    with factory() as session:
        stale = session.scalars(
            select(FineTuningJob).where(FineTuningJob.status.in_(ACTIVE), FineTuningJob.heartbeat_at < cutoff)
        ).all()
        for job in stale:
            last = job.heartbeat_at.isoformat(timespec="seconds") if job.heartbeat_at else "never"
            moved = requeue_or_fail(
                session, job, send=send, error_code=WORKER_LOST, expected_token=job.run_token,
                reason=f"The worker {job.worker_id} running this job stopped responding (last heartbeat {last})",
            )
            if moved is not None:
                reaped.append((job.id, moved))
    return reaped


@dataclass(frozen=True)
class QueueView:
    """What a supervisor needs to tell an idle worker from a stuck one."""

    queued: list[str]  # ids of the jobs waiting that may run now (their tenant is under its limit), in turn order
    active: int  # jobs running (or being cancelled) on the worker asked about


def queue_view(factory: sessionmaker[Session], worker_id: str) -> QueueView:
    """The queued jobs that may run, and how many jobs the worker `worker_id` runs: a job running on
    another worker says nothing of whether this one is stuck."""
    with factory() as session:
        # Jobs held back by their tenant's limit wait on that tenant's running jobs, not on this worker.
        queued = dispatchable_job_ids(session)
        active = session.scalar(select(func.count()).where(FineTuningJob.status.in_(ACTIVE),
                                                           FineTuningJob.worker_id == worker_id))
    return QueueView(queued=list(queued), active=active or 0)
