"""Prometheus: training, read from the database at scrape time (the database holds job state; the
workers run elsewhere and expose nothing a gateway can scrape).

- `loraloom_training_jobs{status}`: jobs in each status now (every status listed, 0 included).
- `loraloom_training_tokens_per_second`: the running jobs' throughput, summed: each one's latest
  step metrics (tokens through the model per second of its run).
- `loraloom_training_trained_tokens_total`: tokens trained by jobs that ended (OpenAI's
  `trained_tokens`, every epoch counted).
- `loraloom_training_queue_wait_seconds`: from a job's creation to the start of its latest run,
  over every job that started (a job requeued after its worker died counts its earlier runs too).

Each is one aggregate query: the database counts, and a scrape carries a few numbers whatever the
number of jobs. A database that does not answer leaves these families out of that scrape (and logs why):
the engine's metrics beside them must still be read.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraloom.platform.db.models import FineTuningJob, FineTuningJobEvent, FineTuningJobStatus

logger = logging.getLogger(__name__)

# Seconds: a queue wait is seconds on an idle worker and hours behind long jobs.
QUEUE_WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


class TrainingCollector(Collector):
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.session_factory = session_factory

    def collect(self) -> Iterator[Metric]:
        try:
            with self.session_factory() as session:
                families = [_jobs_by_status(session), _tokens_per_second(session), _trained_tokens(session),
                            _queue_wait(session)]
        except SQLAlchemyError as error:
            logger.warning("training metrics left out of this scrape: the database did not answer: %s", error)
            return
        yield from families


def _jobs_by_status(session: Session) -> Metric:
    counts = dict(session.execute(select(FineTuningJob.status, func.count()).group_by(FineTuningJob.status)).all())
    family = GaugeMetricFamily("loraloom_training_jobs", "Training jobs, by status.", labels=["status"])
    for status in FineTuningJobStatus:
        family.add_metric([status.value], counts.get(status, 0))
    return family


def _tokens_per_second(session: Session) -> Metric:
    latest = (
        select(func.max(FineTuningJobEvent.id))
        .join(FineTuningJob, FineTuningJob.id == FineTuningJobEvent.job_id)
        .where(FineTuningJob.status == FineTuningJobStatus.running, FineTuningJobEvent.type == "metrics")
        .group_by(FineTuningJobEvent.job_id)
    )
    steps = session.scalars(select(FineTuningJobEvent.data).where(FineTuningJobEvent.id.in_(latest))).all()
    total = sum(float((data or {}).get("tokens_per_second") or 0.0) for data in steps)
    return GaugeMetricFamily("loraloom_training_tokens_per_second",
                             "Tokens per second the running training jobs train, summed (each job's latest step).",
                             value=total)


def _trained_tokens(session: Session) -> Metric:
    total = session.scalar(select(func.coalesce(func.sum(FineTuningJob.trained_tokens), 0)))
    return CounterMetricFamily("loraloom_training_trained_tokens", "Tokens trained by the training jobs that ended.",
                               value=int(total))


def _queue_wait(session: Session) -> Metric:
    wait = _seconds_between(session, FineTuningJob.created_at, FineTuningJob.started_at)
    row = session.execute(
        select(func.count(), func.coalesce(func.sum(wait), 0.0),
               *[func.coalesce(func.sum(case((wait <= bound, 1), else_=0)), 0) for bound in QUEUE_WAIT_BUCKETS])
        .where(FineTuningJob.started_at.is_not(None))
    ).one()
    count, total, *within = row
    buckets = [(floatToGoString(bound), int(number)) for bound, number in zip(QUEUE_WAIT_BUCKETS, within)]
    return HistogramMetricFamily(
        "loraloom_training_queue_wait_seconds", "From a training job's creation to the start of its latest run.",
        buckets=[*buckets, ("+Inf", int(count))], sum_value=float(total),
    )


def _seconds_between(session: Session, start: Any, end: Any) -> ColumnElement[float]:
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", end - start)
    return (func.julianday(end) - func.julianday(start)) * 86400.0  # SQLite stores ISO text, which julianday reads
