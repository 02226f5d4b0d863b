"""Training jobs are dispatched fairly across tenants and within each tenant's concurrent-jobs limit,
on SQLite and PostgreSQL: a worker claims the job whose turn it is (fewest running, then least recently
served tenant, then oldest), a tenant at its limit is passed over and its jobs stay queued, a run that
ends sends the next job's message so held-back jobs are never stranded, and the supervisor's view of
the queue leaves held-back jobs out (they wait on their tenant, not on a stuck worker)."""
from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from training_live import MAX_LORA_RANK, training_settings

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import FineTuningJob, FineTuningJobStatus, Tenant, TenantLimits, utcnow
from loraloom.platform.training.job_state import claim_job, claim_next_job, finish_job, queue_view
from loraloom.platform.training.runner import WorkerContext, run_job


# Each job is created a second after the one before: their order is plain on every database.
START = utcnow() - timedelta(days=1)
CREATED = itertools.count()


def add_tenant(factory: sessionmaker[Session], max_training_jobs: int | None = None) -> uuid.UUID:
    with factory.begin() as session:
        tenant = Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
        session.add(tenant)
        session.flush()
        if max_training_jobs is not None:
            session.add(TenantLimits(tenant_id=tenant.id, max_training_jobs=max_training_jobs, share_weight=1.0))
        return tenant.id


def add_jobs(factory: sessionmaker[Session], tenant_id: uuid.UUID, count: int, model: str = "base") -> list[str]:
    """`count` queued jobs, created one after the other."""
    ids = []
    with factory.begin() as session:
        for _ in range(count):
            job_id = f"ftjob-{uuid.uuid4().hex[:24]}"
            session.add(FineTuningJob(
                id=job_id, tenant_id=tenant_id, model=model, training_file="file-gone", suffix="bot", seed=1,
                hyperparameters={}, status=FineTuningJobStatus.queued, max_attempts=2,
                created_at=START + timedelta(seconds=next(CREATED))))
            ids.append(job_id)
    return ids


def end(factory: sessionmaker[Session], claim) -> None:
    with factory.begin() as session:
        assert finish_job(session, claim, FineTuningJobStatus.succeeded, message="done")


def test_one_tenants_backlog_does_not_hold_another_tenants_job_back(session_factory):
    busy, other = add_tenant(session_factory), add_tenant(session_factory)
    backlog = add_jobs(session_factory, busy, 5)
    late = add_jobs(session_factory, other, 1)
    order = []
    for _ in range(4):  # one worker, one job at a time
        claim = claim_next_job(session_factory, "worker")
        order.append(claim.job_id)
        end(session_factory, claim)
    # First-in-first-out would run the whole backlog first; turns alternate instead.
    assert order == [backlog[0], late[0], backlog[1], backlog[2]]


def test_the_tenant_with_fewest_running_jobs_goes_first(session_factory):
    first, second = add_tenant(session_factory), add_tenant(session_factory)
    first_jobs = add_jobs(session_factory, first, 3)
    second_jobs = add_jobs(session_factory, second, 3)
    claims = [claim_next_job(session_factory, f"worker-{index}") for index in range(4)]
    assert [claim.job_id for claim in claims] == [first_jobs[0], second_jobs[0], first_jobs[1], second_jobs[1]]


def test_a_tenant_at_its_limit_is_passed_over_and_its_jobs_stay_queued(session_factory):
    limited, other = add_tenant(session_factory, max_training_jobs=1), add_tenant(session_factory)
    limited_jobs = add_jobs(session_factory, limited, 2)
    other_jobs = add_jobs(session_factory, other, 1)
    running = claim_next_job(session_factory, "worker-1")
    assert running.job_id == limited_jobs[0]
    assert claim_next_job(session_factory, "worker-2").job_id == other_jobs[0]
    assert claim_next_job(session_factory, "worker-3") is None  # only the limited tenant's job is left
    with session_factory() as session:
        assert session.get(FineTuningJob, limited_jobs[1]).status is FineTuningJobStatus.queued
    # The supervisor does not count it as waiting for a worker: it waits for its tenant's job.
    assert queue_view(session_factory, "worker-3").queued == []
    end(session_factory, running)
    assert queue_view(session_factory, "worker-3").queued == [limited_jobs[1]]
    assert claim_next_job(session_factory, "worker-3").job_id == limited_jobs[1]


def test_a_held_back_job_runs_once_its_tenants_running_job_ends(model_dir: Path, tmp_path: Path):
    settings = training_settings(tmp_path)
    engine = create_db_engine(settings.database_url)
    factory = create_session_factory(engine)
    try:
        limited, other = add_tenant(factory, max_training_jobs=1), add_tenant(factory)
        first, held = add_jobs(factory, limited, 2, model=model_dir.name)
        (other_job,) = add_jobs(factory, other, 1, model=model_dir.name)
        elsewhere = claim_job(factory, first, "another-worker")  # the tenant's one job runs on another worker
        sent: list[str] = []
        context = WorkerContext(settings=settings, model_dir=model_dir, max_lora_rank=MAX_LORA_RANK, worker_id="worker",
                                send=sent.append)

        run_job(held, context)  # its message: the tenant is at its limit, so the other tenant's job runs
        with factory() as session:
            assert session.get(FineTuningJob, held).status is FineTuningJobStatus.queued
            assert session.get(FineTuningJob, other_job).status is FineTuningJobStatus.failed  # file-gone: it ran
        assert sent == []  # nothing else may run yet

        end(factory, elsewhere)
        run_job(other_job, context)  # a duplicate message: nothing left to run but the held-back job, now free
        with factory() as session:
            assert session.get(FineTuningJob, held).status is FineTuningJobStatus.failed  # it ran (file-gone)
        assert sent == []

        more = add_jobs(factory, limited, 1, model=model_dir.name)
        blocker = claim_job(factory, more[0], "another-worker")
        (last,) = add_jobs(factory, limited, 1, model=model_dir.name)
        run_job(last, context)  # spent: the tenant is at its limit again
        assert sent == []
        end(factory, blocker)
        (third,) = add_jobs(factory, other, 1, model=model_dir.name)
        run_job(third, context)  # a run ends, the limited tenant has a free slot: its job's message is sent
        assert sent == [last]
    finally:
        engine.dispose()
