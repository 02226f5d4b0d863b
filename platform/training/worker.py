"""`loraloom worker`: a Celery worker for the training queue, plus the reaper.

The worker's main process only consumes messages; each job runs in a fresh child (max
tasks per child 1), which imports torch. The reaper, a process beside it, requeues or
fails jobs whose worker stopped writing heartbeats, so a job whose worker died (on any
machine) is never left `running`. Several workers reap at once safely: every requeue
is a compare-and-set.
"""
from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

from celery import Celery

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import RUN_JOB_TASK, TRAINING_QUEUE, create_celery_app, send_run_job
from loraloom.platform.training.job_state import reap_stale_jobs

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent() -> None:
    """A Popen preexec_fn: on Linux, the child gets SIGTERM when the process that started it dies,
    so a worker started by `serve` never outlives it (not even a SIGKILLed one)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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


def reap_forever(settings: Settings) -> None:
    """The reaper's process: every heartbeat interval, requeue or fail the jobs whose heartbeat is
    older than the timeout. A process, not a thread of the worker: the worker forks a child per
    job, and a fork while another thread holds a lock (SQLAlchemy's, kombu's) leaves the child
    waiting on that lock for ever."""
    end_with_parent()
    app = create_celery_app(settings)
    db_engine = create_db_engine(settings.database_url)
    factory = create_session_factory(db_engine)
    try:
        while True:
            time.sleep(settings.training_heartbeat_interval_s)
            try:
                for job_id, status in reap_stale_jobs(
                    factory, heartbeat_timeout_s=settings.training_heartbeat_timeout_s,
                    send=lambda job_id: send_run_job(app, job_id),
                ):
                    logger.warning("job %s had a stale heartbeat: now %s", job_id, status.value)
            except Exception:  # the database or broker is down for now: try again next round
                logger.exception("reaping stale training jobs failed")
    finally:
        db_engine.dispose()


def start_reaper(settings: Settings) -> multiprocessing.process.BaseProcess:
    # Spawned, not forked: a fresh interpreter that shares nothing with the worker's state.
    reaper = multiprocessing.get_context("spawn").Process(
        target=reap_forever, args=(settings,), name="training-reaper", daemon=True
    )
    reaper.start()
    return reaper


def run_worker(settings: Settings, model_dir: Path, *, loglevel: str = "INFO") -> None:
    """Consume the training queue until stopped (SIGTERM: finish the current job's step and exit)."""
    app = create_worker_app(settings, model_dir)
    reaper = start_reaper(settings)
    try:
        app.worker_main([
            "worker", f"--loglevel={loglevel}", "--queues", TRAINING_QUEUE, "--concurrency", "1",
            "--pool", "prefork", "--hostname", f"training@{socket.gethostname()}-{os.getpid()}",
            "--without-gossip", "--without-mingle",
        ])
    finally:
        reaper.terminate()
        reaper.join()
