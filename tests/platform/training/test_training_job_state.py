"""The job state machine's compare-and-set transitions, on SQLite and PostgreSQL: a second claim
(a redelivered message) does nothing, a stale job is requeued a bounded number of times and
then failed, a requeued run loses the job, cancel moves queued and running jobs apart, and a
supervisor's view of the queue counts only its own worker's jobs."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.db.models import FineTuningJob, FineTuningJobEvent, FineTuningJobStatus, Tenant, utcnow
from loraloom.platform.training.errors import TrainingConflictError
from loraloom.platform.training.job_state import (
    WORKER_LOST,
    LostOwnershipError,
    beat,
    cancel_requested,
    claim_job,
    finish_job,
    queue_view,
    reap_stale_jobs,
    record_step,
)
from loraloom.platform.training.jobs import cancel_job

HEARTBEAT_TIMEOUT_S = 60.0


@pytest.fixture
def factory(session_factory: sessionmaker[Session]) -> sessionmaker[Session]:
    return session_factory


def add_job(factory: sessionmaker[Session], max_attempts: int = 2) -> tuple[uuid.UUID, str]:
    with factory() as session:
        tenant = Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
        session.add(tenant)
        session.flush()
        job = FineTuningJob(
            id=f"ftjob-{uuid.uuid4().hex[:24]}", tenant_id=tenant.id, model="base", training_file="file-x",
            suffix="bot", seed=1, hyperparameters={}, status=FineTuningJobStatus.queued, max_attempts=max_attempts,
        )
        session.add(job)
        session.commit()
        return tenant.id, job.id


def job_row(factory: sessionmaker[Session], job_id: str) -> FineTuningJob:
    with factory() as session:
        return session.get(FineTuningJob, job_id)


def age_heartbeat(factory: sessionmaker[Session], job_id: str) -> None:
    with factory.begin() as session:
        session.execute(update(FineTuningJob).where(FineTuningJob.id == job_id)
                        .values(heartbeat_at=utcnow() - timedelta(seconds=2 * HEARTBEAT_TIMEOUT_S)))


def test_a_second_claim_of_the_same_job_does_nothing(factory: sessionmaker[Session]) -> None:
    _, job_id = add_job(factory)
    first = claim_job(factory, job_id, "worker-a")
    assert first is not None and first.attempt == 1
    assert claim_job(factory, job_id, "worker-b") is None  # the redelivered message
    job = job_row(factory, job_id)
    assert (job.status, job.attempts, job.worker_id, job.run_token) == (
        FineTuningJobStatus.running, 1, "worker-a", first.run_token)
    with factory() as session:
        finish_job(session, first, FineTuningJobStatus.succeeded, message="done")
        session.commit()
    assert claim_job(factory, job_id, "worker-c") is None  # and after the end
    assert job_row(factory, job_id).status is FineTuningJobStatus.succeeded


def test_each_step_s_metrics_reach_the_job_while_its_run_holds_it(factory: sessionmaker[Session]) -> None:
    _, job_id = add_job(factory)
    first = claim_job(factory, job_id, "worker-a")
    step_one = {"step": 1, "total_steps": 4, "eta_seconds": 3.0, "tokens_per_second": 100.0}
    record_step(factory, first, "Step 1/4", step_one)
    assert job_row(factory, job_id).metrics == step_one  # live, for a jobs list's progress column
    age_heartbeat(factory, job_id)
    reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=lambda _: None)
    # A run that lost the job still logs its step, but no longer writes the job's progress.
    record_step(factory, first, "Step 2/4", {**step_one, "step": 2})
    assert job_row(factory, job_id).metrics == step_one
    with factory() as session:
        steps = session.scalars(select(FineTuningJobEvent.data).where(FineTuningJobEvent.job_id == job_id,
                                                                      FineTuningJobEvent.type == "metrics")).all()
    assert sorted(data["step"] for data in steps) == [1, 2]


def test_stale_jobs_are_requeued_then_failed_after_max_attempts(factory: sessionmaker[Session]) -> None:
    _, job_id = add_job(factory, max_attempts=2)
    sent: list[str] = []
    first = claim_job(factory, job_id, "worker-a")
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == []  # fresh
    age_heartbeat(factory, job_id)
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == [
        (job_id, FineTuningJobStatus.queued)]
    assert sent == [job_id]
    # The first run, if it is still alive somewhere, has lost the job.
    assert not beat(factory, first)
    with pytest.raises(LostOwnershipError):
        cancel_requested(factory, first)

    second = claim_job(factory, job_id, "worker-b")
    assert second is not None and second.attempt == 2
    age_heartbeat(factory, job_id)
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == [
        (job_id, FineTuningJobStatus.failed)]
    assert sent == [job_id]  # not sent again
    job = job_row(factory, job_id)
    assert (job.status, job.error_code, job.attempts) == (FineTuningJobStatus.failed, WORKER_LOST, 2)
    assert "worker-b" in job.error_message and job.finished_at is not None
    with factory() as session:
        levels = session.scalars(select(FineTuningJobEvent.level).where(FineTuningJobEvent.job_id == job_id)).all()
    assert levels.count("warn") == 1 and levels[-1] == "error"


def test_cancel_of_a_queued_job_ends_it_and_of_a_running_one_asks_the_worker(
    factory: sessionmaker[Session],
) -> None:
    tenant_id, queued_id = add_job(factory)
    with factory() as session:
        assert cancel_job(session, tenant_id=tenant_id, job_id=queued_id).status is FineTuningJobStatus.cancelled
        with pytest.raises(TrainingConflictError, match="already cancelled"):
            cancel_job(session, tenant_id=tenant_id, job_id=queued_id)
    assert claim_job(factory, queued_id, "worker-a") is None  # a cancelled job never runs

    tenant_id, running_id = add_job(factory)
    claim = claim_job(factory, running_id, "worker-a")
    assert not cancel_requested(factory, claim)
    with factory() as session:
        assert cancel_job(session, tenant_id=tenant_id, job_id=running_id).status is (
            FineTuningJobStatus.cancel_requested)
    assert cancel_requested(factory, claim)
    assert beat(factory, claim)  # still the run's job until it ends
    with factory() as session:
        assert finish_job(session, claim, FineTuningJobStatus.cancelled, message="stopped")
        session.commit()
    assert job_row(factory, running_id).status is FineTuningJobStatus.cancelled


def test_a_dead_worker_of_a_cancel_requested_job_leaves_it_cancelled(factory: sessionmaker[Session]) -> None:
    tenant_id, job_id = add_job(factory)
    claim_job(factory, job_id, "worker-a")
    with factory() as session:
        cancel_job(session, tenant_id=tenant_id, job_id=job_id)
    age_heartbeat(factory, job_id)
    sent: list[str] = []
    assert reap_stale_jobs(factory, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, send=sent.append) == [
        (job_id, FineTuningJobStatus.cancelled)]
    assert sent == []


def test_the_queue_view_counts_only_the_jobs_of_the_worker_asked_about(factory: sessionmaker[Session]) -> None:
    _, waiting = add_job(factory)
    _, elsewhere = add_job(factory)
    claim_job(factory, elsewhere, "other-host:1")  # busy on another worker: says nothing of ours
    view = queue_view(factory, "this-host:2")
    assert waiting in view.queued and elsewhere not in view.queued
    assert view.active == 0

    _, ours = add_job(factory)
    claim_job(factory, ours, "this-host:2")
    assert queue_view(factory, "this-host:2").active == 1
    assert queue_view(factory, "other-host:1").active >= 1
