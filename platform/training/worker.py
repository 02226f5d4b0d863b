"""`loraloom worker`: a Celery worker for the training queue, plus the reaper.

The worker's main process only consumes messages and reaps; each job runs in a fresh
child (max tasks per child 1), which imports torch. The reaper, a thread of the main
process, requeues or fails jobs whose worker stopped writing heartbeats, so a job whose
worker died (on any machine) is never left `running`. Several workers reap at once
safely: every requeue is a compare-and-set.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

from celery import Celery

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import RUN_JOB_TASK, TRAINING_QUEUE, create_celery_app, send_run_job
from loraloom.platform.training.job_state import reap_stale_jobs

logger = logging.getLogger(__name__)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def create_worker_app(settings: Settings, model_dir: Path) -> Celery:
    """The Celery app with the training task registered; `model_dir` is the served base."""
    app = create_celery_app(settings)
    if settings.broker_url is None:
        # The embedded broker is for one machine: no remote control, whose broadcasts it does not need.
        app.conf.worker_enable_remote_control = False

    @app.task(name=RUN_JOB_TASK, ignore_result=True)
    def run_job_task(job_id: str) -> None:
        from loraloom.platform.training.runner import WorkerContext, run_job

        context = WorkerContext(
            settings=settings, model_dir=model_dir, worker_id=worker_id(),
            send=lambda requeued_id: send_run_job(app, requeued_id),
        )
        run_job(job_id, context)

    return app


class Reaper:
    """Every `interval_s`, requeue or fail the jobs whose heartbeat is older than the timeout."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="training-reaper", daemon=True)

    def _run(self) -> None:
        db_engine = create_db_engine(self.settings.database_url)
        factory = create_session_factory(db_engine)
        try:
            while not self.stop.wait(self.settings.training_heartbeat_interval_s):
                try:
                    for job_id, status in reap_stale_jobs(
                        factory, heartbeat_timeout_s=self.settings.training_heartbeat_timeout_s,
                        send=lambda job_id: send_run_job(self.app, job_id),
                    ):
                        logger.warning("job %s had a stale heartbeat: now %s", job_id, status.value)
                except Exception:  # the database or broker is down for now: try again next round
                    logger.exception("reaping stale training jobs failed")
        finally:
            db_engine.dispose()

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_worker(settings: Settings, model_dir: Path, *, loglevel: str = "INFO") -> None:
    """Consume the training queue until stopped (SIGTERM: finish the current job's step and exit)."""
    app = create_worker_app(settings, model_dir)
    reaper = Reaper(settings, app)
    reaper.start()
    try:
        app.worker_main([
            "worker", f"--loglevel={loglevel}", "--queues", TRAINING_QUEUE, "--concurrency", "1",
            "--pool", "prefork", "--hostname", f"training@{socket.gethostname()}-{os.getpid()}",
            "--without-gossip", "--without-mingle",
        ])
    finally:
        reaper.close()
