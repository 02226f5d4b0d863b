"""Which queued job runs next: fair across tenants, within each tenant's concurrent-jobs limit.

A job's message asks a worker to run *a* job, not necessarily the one it names: the worker claims
the job whose turn it is. Turns go first to the tenant with the fewest jobs running, then to the
tenant served least recently (whose latest job started earliest, or never), then to the oldest job;
within a tenant jobs run oldest first. A tenant at its max_training_jobs (tenant_limits) is passed
over: its jobs stay queued. One tenant queueing 50 jobs thus gets every other turn, not all of them.

Messages are conserved: every queued job was sent once, and each message claims at most one job.
A message that finds no job it may run (every queued one belongs to a tenant at its limit) is
dropped, and the run that frees a slot sends one again when it ends (runner.run_job), so a job
held back by its limit is never stranded.

Claims are serialized (an advisory lock on PostgreSQL, the writer lock on SQLite), so two workers
never both take a tenant's last free slot.
"""
from __future__ import annotations

from sqlalchemy import ColumnElement, Select, func, or_, select
from sqlalchemy.orm import Session

from loraloom.platform.db.locking import for_update
from loraloom.platform.db.models import FineTuningJob, FineTuningJobStatus, TenantLimits

# A worker holds the job: running, or asked to stop (it ends the job at its next step).
ACTIVE = (FineTuningJobStatus.running, FineTuningJobStatus.cancel_requested, FineTuningJobStatus.pause_requested)
# Any number that no other advisory lock of this database uses: "loraloom training claims".
CLAIM_LOCK_ID = 0x6C6C7463


def lock_claims(session: Session) -> None:
    """Serialize claims until the transaction ends."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(CLAIM_LOCK_ID)))
    else:
        session.execute(for_update(session, select(FineTuningJob.id).limit(0)))


def dispatchable_jobs() -> tuple[Select, ColumnElement]:
    """Queued jobs whose tenant is under its limit, in turn order; and the turn order's columns."""
    running = (select(FineTuningJob.tenant_id, func.count().label("jobs"))
               .where(FineTuningJob.status.in_(ACTIVE)).group_by(FineTuningJob.tenant_id).subquery())
    served = (select(FineTuningJob.tenant_id, func.max(FineTuningJob.started_at).label("last_start"))
              .group_by(FineTuningJob.tenant_id).subquery())
    jobs_running = func.coalesce(running.c.jobs, 0)
    query = (
        select(FineTuningJob.id)
        .outerjoin(running, running.c.tenant_id == FineTuningJob.tenant_id)
        .outerjoin(served, served.c.tenant_id == FineTuningJob.tenant_id)
        .outerjoin(TenantLimits, TenantLimits.tenant_id == FineTuningJob.tenant_id)
        .where(FineTuningJob.status == FineTuningJobStatus.queued)
        .where(or_(TenantLimits.max_training_jobs.is_(None), jobs_running < TenantLimits.max_training_jobs))
        .order_by(jobs_running, served.c.last_start.is_not(None), served.c.last_start,
                  FineTuningJob.created_at, FineTuningJob.id)
    )
    return query, jobs_running


def next_job(session: Session) -> str | None:
    """The id of the job whose turn it is, or None when no queued job may run now."""
    query, _ = dispatchable_jobs()
    return session.scalar(query.limit(1))


def dispatchable_job_ids(session: Session) -> list[str]:
    """Every queued job that may run now, in turn order."""
    query, _ = dispatchable_jobs()
    return list(session.scalars(query))
