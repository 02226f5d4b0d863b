"""Pause and resume as compare-and-set transitions, on SQLite and PostgreSQL: a running job is asked
to pause and its run sees the request; `paused` is a rest state no reaper touches, and a run that dies
with its pause pending ends the job paused, never running; resume requeues paused, failed and cancelled
jobs with a fresh budget of attempts, and refuses every other state with a reason."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from test_training_job_state import HEARTBEAT_TIMEOUT_S, add_job, age_heartbeat, job_row

from loraloom.platform.db.models import FineTuningJob, FineTuningJobStatus, utcnow
from loraloom.platform.training.errors import TrainingConflictError
from loraloom.platform.training.job_state import claim_job, finish_job, reap_stale_jobs, stop_request
from loraloom.platform.training.jobs import cancel_job
from loraloom.platform.training.lifecycle import pause_job, resume_job


@pytest.fixture
def factory(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    return session_factory


def act(factory: sessionmaker[Session], change, tenant_id: uuid.UUID, job_id: str, **arguments) -> FineTuningJob:
    with factory() as session:
        return change(session, tenant_id=tenant_id, job_id=job_id, **arguments)


def test_a_running_job_is_asked_to_pause_and_a_dead_run_leaves_it_paused(factory: sessionmaker[Session]) -> None:
    tenant_id, job_id = add_job(factory)
    claim = claim_job(factory, job_id, "worker-a")
    assert stop_request(factory, claim) is None
    assert act(factory, pause_job, tenant_id, job_id).status is FineTuningJobStatus.pause_requested
    assert act(factory, pause_job, tenant_id, job_id).status is FineTuningJobStatus.pause_requested  # idempotent
    assert stop_request(factory, claim) is FineTuningJobStatus.pause_requested
    with pytest.raises(TrainingConflictError, match="is stopping"):
        act(factory, resume_job, tenant_id, job_id, max_attempts=2, send=lambda _: None)

    age_heartbeat(factory, job_id)  # the worker died while the pause was pending
    sent: list[str] = []
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == [
        (job_id, FineTuningJobStatus.paused)]
    job = job_row(factory, job_id)
    assert (job.status, job.run_token, job.finished_at, sent) == (FineTuningJobStatus.paused, None, None, [])

    with factory.begin() as session:  # however old its last heartbeat, a paused job is at rest
        session.execute(update(FineTuningJob).where(FineTuningJob.id == job_id)
                        .values(heartbeat_at=utcnow() - timedelta(days=1)))
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == []
    assert job_row(factory, job_id).status is FineTuningJobStatus.paused


def test_cancel_overrides_a_pending_pause(factory: sessionmaker[Session]) -> None:
    tenant_id, job_id = add_job(factory)
    claim = claim_job(factory, job_id, "worker-a")
    act(factory, pause_job, tenant_id, job_id)
    assert act(factory, cancel_job, tenant_id, job_id).status is FineTuningJobStatus.cancel_requested
    assert stop_request(factory, claim) is FineTuningJobStatus.cancel_requested
    with pytest.raises(TrainingConflictError, match="only a queued or running job can be paused"):
        act(factory, pause_job, tenant_id, job_id)


@pytest.mark.parametrize("ended", [FineTuningJobStatus.failed, FineTuningJobStatus.cancelled])
def test_a_failed_or_cancelled_job_resumes_with_a_fresh_budget(
    factory: sessionmaker[Session], ended: FineTuningJobStatus
) -> None:
    tenant_id, job_id = add_job(factory, max_attempts=1)
    claim = claim_job(factory, job_id, "worker-a")
    with factory() as session:
        assert finish_job(session, claim, ended, message="ended", error=("system_error", "boom", None))
        session.commit()
    sent: list[str] = []
    job = act(factory, resume_job, tenant_id, job_id, max_attempts=3, send=sent.append)
    assert (job.status, job.attempts, job.max_attempts, job.finished_at) == (FineTuningJobStatus.queued, 1, 4, None)
    assert (job.error_code, job.error_message, sent) == (None, None, [job_id])
    assert claim_job(factory, job_id, "worker-b").attempt == 2  # runs again


def test_resume_refuses_a_succeeded_or_unfinished_job_and_an_unsent_one_fails(factory: sessionmaker[Session]) -> None:
    tenant_id, job_id = add_job(factory)
    with pytest.raises(TrainingConflictError, match="queued; only a paused, failed or cancelled job"):
        act(factory, resume_job, tenant_id, job_id, max_attempts=2, send=lambda _: None)
    claim = claim_job(factory, job_id, "worker-a")
    with pytest.raises(TrainingConflictError, match="running; only a paused"):
        act(factory, resume_job, tenant_id, job_id, max_attempts=2, send=lambda _: None)
    with factory() as session:
        finish_job(session, claim, FineTuningJobStatus.succeeded, message="done")
        session.commit()
    with pytest.raises(TrainingConflictError, match="has succeeded; there is nothing to resume"):
        act(factory, resume_job, tenant_id, job_id, max_attempts=2, send=lambda _: None)

    tenant_id, job_id = add_job(factory)
    act(factory, pause_job, tenant_id, job_id)

    def broker_down(_: str) -> None:
        raise ConnectionError("broker unreachable")

    job = act(factory, resume_job, tenant_id, job_id, max_attempts=2, send=broker_down)
    assert job.status is FineTuningJobStatus.failed and "could not be sent" in job.error_message
