"""`loraloom worker`: a Celery worker for the training queue, plus the reaper.

The worker's main process only consumes messages; each job runs in a fresh child (max
tasks per child 1), which imports torch, and which dies with the main process (a job
child left running by a killed worker would train on with nobody to report to). The
reaper, a process beside it, requeues or fails jobs whose worker stopped writing
heartbeats, so a job whose worker died (on any machine) is never left `running`.
Several reapers (other workers', serve's) run at once safely: every requeue is a
compare-and-set.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

from celery import Celery
from celery.signals import worker_process_init

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.log_format import configure_logging, stdout_as_log_lines
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import RUN_JOB_TASK, TRAINING_QUEUE, create_celery_app, send_run_job
from loraloom.platform.training.job_state import reap_stale_jobs

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Called in a child process (a Popen preexec_fn, or first thing in it): on Linux, the child
    gets `sig` when the thread that started it dies, so it never outlives its parent, not even a
    SIGKILLed one. Linux ties this to the starting *thread*: start children from a long-lived one.
    `parent_pid`, the parent's pid as the parent saw it, covers a parent that died before this
    call (the signal would never come): the child then gets `sig` at once."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def _job_child_ends_with_worker(worker_pid: int, **_: object) -> None:
    # SIGKILL: the worker main is gone, so nothing would take this run's result; its job is
    # requeued by a reaper once its heartbeat is stale, and resumes from its last checkpoint.
    end_with_parent(signal.SIGKILL, worker_pid)


def worker_id(worker_pid: int) -> str:
    """How a job names the worker running it: the host and the worker's main process, not the
    pool child that runs the job, so that `serve` can tell its own worker's jobs from others'."""
    return f"{socket.gethostname()}:{worker_pid}"


def create_worker_app(settings: Settings, model_dir: Path, max_lora_rank: int) -> Celery:
    """The Celery app with the training task registered; `model_dir` is the served base and
    `max_lora_rank` the largest rank the servers load (their --max-lora-rank)."""
    app = create_celery_app(settings)
    worker_pid = os.getpid()  # the worker's main process: each job runs in a child it forks
    worker_process_init.connect(functools.partial(_job_child_ends_with_worker, worker_pid), weak=False)
    if settings.broker_url is None:
        # The embedded broker is for one machine: no remote control, whose broadcasts it does not need.
        app.conf.worker_enable_remote_control = False

    @app.task(name=RUN_JOB_TASK, ignore_result=True)
    def run_job_task(job_id: str) -> None:
        from loraloom.platform.training.runner import WorkerContext, run_job

        context = WorkerContext(
            settings=settings, model_dir=model_dir, max_lora_rank=max_lora_rank, worker_id=worker_id(worker_pid),
            send=lambda requeued_id: send_run_job(app, requeued_id),
        )
        run_job(job_id, context)

    return app


def reap_forever(settings: Settings, worker_pid: int, log_level: str) -> None:
    """The reaper's process: every heartbeat interval, requeue or fail the jobs whose heartbeat is
    older than the timeout. A process, not a thread of the worker: the worker forks a child per
    job, and a fork while another thread holds a lock (SQLAlchemy's, kombu's) leaves the child
    waiting on that lock for ever."""
    end_with_parent(signal.SIGTERM, worker_pid)
    # A fresh interpreter: its lines are JSON as the worker's. Ctrl-C reaches the whole process group;
    # the worker stops the reaper itself (SIGTERM), so the reaper ignores it rather than print a traceback.
    configure_logging(log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
                    logger.warning("job %s had a stale heartbeat: now %s", job_id, status.value,
                                   extra={"job_id": job_id})
            except Exception:  # the database or broker is down for now: try again next round
                logger.exception("reaping stale training jobs failed")
    finally:
        db_engine.dispose()


def start_reaper(settings: Settings, log_level: str) -> multiprocessing.process.BaseProcess:
    # Spawned, not forked: a fresh interpreter that shares nothing with the worker's state.
    reaper = multiprocessing.get_context("spawn").Process(
        target=reap_forever, args=(settings, os.getpid(), log_level), name="training-reaper", daemon=True
    )
    reaper.start()
    return reaper


def run_worker(settings: Settings, model_dir: Path, max_lora_rank: int, *, loglevel: str = "INFO") -> None:
    """Consume the training queue until stopped (SIGTERM: finish the current job's step and exit).
    Its log is JSON lines on stderr, Celery's included (the caller configured logging): Celery keeps
    the root logger's handler (worker_hijack_root_logger off), prints no banner (--quiet), and what it
    writes to stdout regardless (its shutdown notices) becomes log lines of logger `celery.stdout`."""
    stdout_as_log_lines("celery.stdout")
    app = create_worker_app(settings, model_dir, max_lora_rank)
    reaper = start_reaper(settings, loglevel)
    try:
        app.worker_main([
            "--quiet", "worker", f"--loglevel={loglevel}", "--queues", TRAINING_QUEUE, "--concurrency", "1",
            "--pool", "prefork", "--hostname", f"training@{socket.gethostname()}-{os.getpid()}",
            "--without-gossip", "--without-mingle",
        ])
    finally:
        reaper.terminate()
        reaper.join()
