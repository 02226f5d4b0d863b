"""The training families (metering/training_metrics.py), read from jobs and events in a real database
(SQLite and PostgreSQL: the queue wait is computed in SQL, differently on each) through a registry
scraped as Prometheus text: jobs by status, the running jobs' tokens per second from their latest
step, the tokens of ended jobs, and the queue wait histogram. Its registration in the app is checked
by test_operator_metrics.py."""
from __future__ import annotations

import uuid
from datetime import timedelta

from live_api import new_tenant
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraloom.platform.db.models import FineTuningJob, FineTuningJobEvent, FineTuningJobStatus, utcnow
from loraloom.platform.metering.training_metrics import TrainingCollector

CREATED = utcnow() - timedelta(hours=1)


def job(tenant_id, status: FineTuningJobStatus, *, waited_s: float | None, trained_tokens: int | None = None):
    return FineTuningJob(
        id=f"ftjob-{uuid.uuid4().hex[:24]}", tenant_id=tenant_id, model="base", training_file="file-x", suffix="bot",
        seed=1, hyperparameters={}, status=status, max_attempts=2, created_at=CREATED, trained_tokens=trained_tokens,
        started_at=None if waited_s is None else CREATED + timedelta(seconds=waited_s),
    )


def scrape(session_factory) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TrainingCollector(session_factory))
    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_training_jobs_throughput_tokens_and_queue_wait(session_factory):
    with session_factory.begin() as session:
        tenant = new_tenant(session)
        running = job(tenant.id, FineTuningJobStatus.running, waited_s=3.0)
        other_running = job(tenant.id, FineTuningJobStatus.running, waited_s=100.0)
        session.add_all([
            running, other_running,
            job(tenant.id, FineTuningJobStatus.succeeded, waited_s=20000.0, trained_tokens=1234),
            job(tenant.id, FineTuningJobStatus.cancelled, waited_s=None, trained_tokens=None),  # cancelled while queued
            job(tenant.id, FineTuningJobStatus.queued, waited_s=None),
            job(tenant.id, FineTuningJobStatus.queued, waited_s=None),
        ])
        session.flush()
        # Each running job's latest step counts, not its earlier ones nor its plain messages.
        for job_id, rates in ((running.id, (10.0, 25.0)), (other_running.id, (7.5,))):
            for step, rate in enumerate(rates):
                session.add(FineTuningJobEvent(job_id=job_id, level="info", type="metrics", message=f"Step {step}",
                                               data={"step": step, "tokens_per_second": rate}))
            session.add(FineTuningJobEvent(job_id=job_id, level="info", type="message", message="saved", data=None))

    metrics = scrape(session_factory)
    jobs = {labels[0][1]: value for (name, labels), value in metrics.items() if name == "loraloom_training_jobs"}
    assert jobs == {"validating_files": 0, "queued": 2, "running": 2, "succeeded": 1, "failed": 0,
                    "cancel_requested": 0, "cancelled": 1, "pause_requested": 0, "paused": 0}
    assert metrics[("loraloom_training_tokens_per_second", ())] == 25.0 + 7.5
    assert metrics[("loraloom_training_trained_tokens_total", ())] == 1234
    wait = "loraloom_training_queue_wait_seconds"
    assert metrics[(f"{wait}_count", ())] == 3  # the jobs that started
    assert abs(metrics[(f"{wait}_sum", ())] - 20103.0) < 0.01
    buckets = {labels[0][1]: value for (name, labels), value in metrics.items() if name == f"{wait}_bucket"}
    assert (buckets["1.0"], buckets["5.0"], buckets["60.0"], buckets["120.0"]) == (0, 1, 1, 2)
    assert (buckets["7200.0"], buckets["21600.0"], buckets["+Inf"]) == (2, 3, 3)


def test_no_jobs_read_as_zeros(session_factory):
    metrics = scrape(session_factory)
    assert metrics[("loraloom_training_tokens_per_second", ())] == 0
    assert metrics[("loraloom_training_queue_wait_seconds_count", ())] == 0
    assert sum(value for (name, _), value in metrics.items() if name == "loraloom_training_jobs") == 0
