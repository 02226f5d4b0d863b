"""The worker's task body (runner.run_job) in-process, on faults found before any training step:
the user's fault fails the job with its code and param at once (a rank above the one the server
serves is one); a system fault is retried until the attempts run out, then fails as system_error;
a message for a finished job does nothing."""
from __future__ import annotations

import logging
import uuid
from pathlib import Path

from sqlalchemy import func, select
from training_live import MAX_LORA_RANK, training_settings

from live_api import new_tenant
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import FineTuningJob, FineTuningJobEvent, FineTuningJobStatus
from loraloom.platform.settings import Settings
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.job_state import SYSTEM_ERROR
from loraloom.platform.training.runner import WorkerContext, run_job


def add_job(settings: Settings, *, model: str, max_attempts: int = 2) -> str:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            tenant = new_tenant(session)
            job = FineTuningJob(
                id=f"ftjob-{uuid.uuid4().hex[:24]}", tenant_id=tenant.id, model=model, training_file="file-gone",
                suffix="bot", seed=1, hyperparameters={}, status=FineTuningJobStatus.queued,
                max_attempts=max_attempts,
            )
            session.add(job)
            session.commit()
            return job.id
    finally:
        engine.dispose()


def job_and_event_count(settings: Settings, job_id: str) -> tuple[FineTuningJob, int]:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            count = session.scalar(select(func.count()).where(FineTuningJobEvent.job_id == job_id))
            return session.get(FineTuningJob, job_id), count
    finally:
        engine.dispose()


def context(settings: Settings, model_dir: Path, sent: list[str], max_lora_rank: int = MAX_LORA_RANK) -> WorkerContext:
    return WorkerContext(settings=settings, model_dir=model_dir, max_lora_rank=max_lora_rank, worker_id="test-worker",
                         send=sent.append)


def test_a_deleted_training_file_fails_the_job_as_the_user_s_fault(model_dir: Path, tmp_path: Path) -> None:
    settings = training_settings(tmp_path)
    job_id = add_job(settings, model=model_dir.name)
    sent: list[str] = []
    run_job(job_id, context(settings, model_dir, sent))
    job, _ = job_and_event_count(settings, job_id)
    assert (job.status, job.error_code, job.error_param) == (FineTuningJobStatus.failed, "file_not_found", "training_file")
    assert job.attempts == 1 and sent == [] and job.run_token is None


def test_a_rank_above_the_served_one_fails_the_job_before_it_reads_or_trains(model_dir: Path, tmp_path: Path):
    """The worker holds a job to the rank its server serves (serve's --max-lora-rank, passed to the worker),
    not to the engine's default: a job accepted while the server served a higher rank must not train an
    adapter the server cannot load."""
    settings = training_settings(tmp_path)
    job_id = add_job(settings, model=model_dir.name)  # default hyperparameters; its training file is gone too
    served_rank = Hyperparameters().lora_r // 2
    sent: list[str] = []
    run_job(job_id, context(settings, model_dir, sent, max_lora_rank=served_rank))
    job, _ = job_and_event_count(settings, job_id)
    assert (job.status, job.error_code, job.error_param) == (
        FineTuningJobStatus.failed, "invalid_hyperparameters", "hyperparameters.lora_r"
    )
    assert f"largest rank this server serves ({served_rank})" in job.error_message
    assert job.attempts == 1 and sent == []


def test_a_system_fault_is_retried_then_fails_and_a_stale_message_does_nothing(
    model_dir: Path, tmp_path: Path
) -> None:
    settings = training_settings(tmp_path)
    job_id = add_job(settings, model="another-base", max_attempts=2)  # this worker cannot train it
    sent: list[str] = []
    run_job(job_id, context(settings, model_dir, sent))
    job, _ = job_and_event_count(settings, job_id)
    assert (job.status, job.attempts, sent) == (FineTuningJobStatus.queued, 1, [job_id])

    run_job(job_id, context(settings, model_dir, sent))
    job, events = job_and_event_count(settings, job_id)
    assert (job.status, job.error_code, job.attempts) == (FineTuningJobStatus.failed, SYSTEM_ERROR, 2)
    assert "another-base" in job.error_message and sent == [job_id]

    run_job(job_id, context(settings, model_dir, sent))  # a redelivered message for the finished job
    again, events_after = job_and_event_count(settings, job_id)
    assert (again.status, again.attempts, events_after, sent) == (FineTuningJobStatus.failed, 2, events, [job_id])


def test_every_line_the_worker_logs_for_a_job_names_it(model_dir: Path, tmp_path: Path, caplog) -> None:
    settings = training_settings(tmp_path)
    job_id = add_job(settings, model=model_dir.name)
    caplog.set_level(logging.INFO, logger="loraloom.platform.training")
    run_job(job_id, context(settings, model_dir, []))
    lines = [record for record in caplog.records if record.name.startswith("loraloom.platform.training")]
    messages = [record.getMessage() for record in lines]
    assert any("started" in message for message in messages), messages
    assert any(record.levelno == logging.ERROR and "failed" in record.getMessage() for record in lines), messages
    assert {getattr(record, "job_id", None) for record in lines} == {job_id}
