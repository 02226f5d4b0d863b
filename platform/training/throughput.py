"""How fast this deployment trains a tenant's jobs, per base model: what an estimate divides a job's
tokens by.

Each job that succeeds in one run reports its tokens, the time its optimizer loop took (steps,
evaluations, checkpoints) and the time before it (loading the model, for DPO the reference
log-probabilities): a job takes startup + tokens / rate, and both terms are moving averages, so they
follow a change of hardware within a few jobs. One rate over the whole run would make a job twice as
long as the last look cheaper per token than it is, since the startup is paid once. It is kept per tenant: one rate for all
would change whenever any tenant's job ended, telling every tenant when others train and how much.
Before any job of the tenant on a model has succeeded here, estimates use DEFAULT_TOKENS_PER_SECOND
and say so (`measured` false).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.db.models import TrainingThroughput, utcnow

# Guesses for a small model on one GPU; they are replaced by the first measurement.
DEFAULT_TOKENS_PER_SECOND = 2000.0
DEFAULT_STARTUP_SECONDS = 20.0
# The weight of the newest run in the moving average.
SMOOTHING = 0.3


@dataclass(frozen=True)
class Rate:
    tokens_per_second: float  # of the optimizer loop
    startup_seconds: float  # before the loop
    measured: bool  # False: the defaults, no job of this tenant and model has been measured here
    runs: int  # runs averaged

    def seconds_for(self, tokens: int) -> float:
        return self.startup_seconds + tokens / self.tokens_per_second


def training_rate(session: Session, tenant_id: uuid.UUID, model: str) -> Rate:
    row = session.get(TrainingThroughput, (tenant_id, model))
    if row is None:
        return Rate(tokens_per_second=DEFAULT_TOKENS_PER_SECOND, startup_seconds=DEFAULT_STARTUP_SECONDS,
                    measured=False, runs=0)
    return Rate(tokens_per_second=row.tokens_per_second, startup_seconds=row.startup_seconds, measured=True,
                runs=row.runs)


def record_run(
    factory: sessionmaker[Session], tenant_id: uuid.UUID, model: str, *, tokens: int, training_seconds: float,
    startup_seconds: float,
) -> None:
    """Fold one run's throughput into the tenant's rate for the model."""
    if tokens <= 0 or training_seconds <= 0:
        return
    measured = tokens / training_seconds
    startup = max(startup_seconds, 0.0)
    for _ in range(2):  # a first row inserted by two workers at once: the loser updates the winner's
        with factory() as session:
            if session.get(TrainingThroughput, (tenant_id, model)) is None:
                session.add(TrainingThroughput(tenant_id=tenant_id, model=model, tokens_per_second=measured,
                                               startup_seconds=startup, runs=1))
            else:
                # One statement, so that runs finishing together each count.
                mine = (TrainingThroughput.tenant_id == tenant_id) & (TrainingThroughput.model == model)
                session.execute(update(TrainingThroughput).where(mine).values(
                    tokens_per_second=TrainingThroughput.tokens_per_second * (1 - SMOOTHING) + measured * SMOOTHING,
                    startup_seconds=TrainingThroughput.startup_seconds * (1 - SMOOTHING) + startup * SMOOTHING,
                    runs=TrainingThroughput.runs + 1, updated_at=utcnow(),
                ))
            try:
                session.commit()
                return
            except IntegrityError:
                session.rollback()
