"""Pausing and resuming a fine-tuning job, as OpenAI's API does (POST .../pause, .../resume).

A queued job pauses at once. A running one is asked to (pause_requested): its worker stops after
the current step, saves a checkpoint with the run's whole state (resume.py) and ends the job
`paused`, which no worker holds. Resume puts a paused, failed or cancelled job back in the queue;
its next run continues from the job's last checkpoint (optimizer, schedule, RNG, data position),
exactly as a retry does, so a paused and resumed job trains the adapter an uninterrupted one would.
A resumed job gets a fresh budget of attempts: the runs before it were the user's to end.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable

from sqlalchemy import update
from sqlalchemy.orm import Session

from loraloom.platform.db.models import FineTuningJob, FineTuningJobStatus
from loraloom.platform.training.errors import TrainingConflictError
from loraloom.platform.training.job_state import add_event
from loraloom.platform.training.jobs import fail_unsent, find_job, move_job

RESUMABLE = (FineTuningJobStatus.paused, FineTuningJobStatus.failed, FineTuningJobStatus.cancelled)


def pause_job(session: Session, *, tenant_id: uuid.UUID, job_id: str) -> FineTuningJob:
    job = find_job(session, tenant_id=tenant_id, job_id=job_id)
    transitions = (
        (FineTuningJobStatus.validating_files, FineTuningJobStatus.paused, "The job was paused before it ran"),
        (FineTuningJobStatus.queued, FineTuningJobStatus.paused, "The job was paused before it ran"),
        (FineTuningJobStatus.running, FineTuningJobStatus.pause_requested,
         "Pause requested; the job stops after its current step and saves a checkpoint"),
    )
    if move_job(session, job, transitions) or job.status is FineTuningJobStatus.pause_requested:
        return job
    raise TrainingConflictError(
        f"fine-tuning job {job_id} is {job.status.value}; only a queued or running job can be paused"
    )


def resume_job(
    session: Session, *, tenant_id: uuid.UUID, job_id: str, max_attempts: int, send: Callable[[str], None]
) -> FineTuningJob:
    """Queue a paused, failed or cancelled job again and send it to the workers."""
    job = find_job(session, tenant_id=tenant_id, job_id=job_id)
    if job.status not in RESUMABLE:
        raise TrainingConflictError(_why_not_resumable(job))
    was = job.status
    moved = session.execute(
        update(FineTuningJob)
        .where(FineTuningJob.id == job.id, FineTuningJob.status == was)
        .values(status=FineTuningJobStatus.queued, finished_at=None, error_code=None, error_message=None,
                error_param=None, run_token=None, worker_id=None, heartbeat_at=None,
                max_attempts=FineTuningJob.attempts + max_attempts)
    ).rowcount
    if not moved:  # moved meanwhile (a second resume won): say what it is now
        session.rollback()
        session.refresh(job)
        raise TrainingConflictError(_why_not_resumable(job))
    add_event(session, job.id, f"The {was.value} job was resumed; it is queued and continues from its last checkpoint")
    session.commit()
    session.refresh(job)
    try:
        send(job.id)
    except Exception as error:  # the broker is unreachable: say so rather than leave the job queued for ever
        fail_unsent(session, job, error)
    return job


def _why_not_resumable(job: FineTuningJob) -> str:
    if job.status is FineTuningJobStatus.succeeded:
        return (f"fine-tuning job {job.id} has succeeded; there is nothing to resume (to train on from its result, "
                "create a job with from_checkpoint)")
    if job.status in (FineTuningJobStatus.pause_requested, FineTuningJobStatus.cancel_requested):
        return f"fine-tuning job {job.id} is stopping ({job.status.value}); resume it once it has stopped"
    return f"fine-tuning job {job.id} is {job.status.value}; only a paused, failed or cancelled job can be resumed"
