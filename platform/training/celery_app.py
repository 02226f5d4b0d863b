"""The Celery app of training jobs, configured for long GPU jobs (Celery's defaults suit short tasks).

- Late acks and reject-on-worker-lost: a message is acknowledged only once its run is over,
  so a worker process that dies does not lose the job. A redelivered message is harmless:
  the task claims a job with a compare-and-set in the database (job_state.claim_next_job: the
  job whose turn it is, training/dispatch.py).
- Prefetch 1, concurrency 1, a fresh child process per job: one job per worker, and the
  memory (GPU memory included) of a finished job goes back with its process. The parent
  never imports torch, so CUDA is never initialized before the fork.
- Time limits: the soft one ends the run with a clear error; the hard one, a minute later,
  kills a run that ignores it. The Redis visibility timeout is longer than both, so a
  healthy long job is never redelivered to a second worker while it runs.
- Messages carry only the job id; the database holds job state, events and metrics, so
  there is no result backend.

The broker: `settings.broker_url` (redis://..., amqp://...), or, when unset, an embedded
one that needs no server: kombu's filesystem transport on a folder under data_dir, which
every process on this machine (`serve` and the worker it starts) shares.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery

from loraloom.platform.settings import Settings

TRAINING_QUEUE = "training"
RUN_JOB_TASK = "loraloom.training.run_job"
EMBEDDED_BROKER_URL = "filesystem://"
# The hard limit leaves the soft one's handler this long to save a checkpoint and report.
HARD_LIMIT_MARGIN_S = 60
# A message is redelivered only after this long unacknowledged; longer than any run can last.
VISIBILITY_MARGIN_S = 3600


def broker_url(settings: Settings) -> str:
    return settings.broker_url or EMBEDDED_BROKER_URL


def embedded_broker_dir(settings: Settings) -> Path:
    return settings.data_dir / "broker"


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    if settings.broker_url is None:
        messages = embedded_broker_dir(settings) / "messages"
        control = embedded_broker_dir(settings) / "control"
        for folder in (messages, control):
            folder.mkdir(parents=True, exist_ok=True)
        # Producers write and consumers read the same folder.
        return {"data_folder_in": str(messages), "data_folder_out": str(messages), "control_folder": str(control)}
    return {"visibility_timeout": hard_time_limit_s(settings) + VISIBILITY_MARGIN_S}


def hard_time_limit_s(settings: Settings) -> int:
    return settings.training_time_limit_s + HARD_LIMIT_MARGIN_S


def create_celery_app(settings: Settings) -> Celery:
    """The app both sides use: the API sends RUN_JOB_TASK with it, `loraloom worker` runs it."""
    app = Celery("loraloom", set_as_current=False)
    app.conf.update(
        broker_url=broker_url(settings),
        broker_transport_options=broker_transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        worker_max_tasks_per_child=1,
        task_soft_time_limit=settings.training_time_limit_s,
        task_time_limit=hard_time_limit_s(settings),
        task_default_queue=TRAINING_QUEUE,
        task_routes={RUN_JOB_TASK: {"queue": TRAINING_QUEUE}},
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        # A publish to an unreachable broker fails the API call quickly instead of hanging it.
        task_publish_retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
    )
    return app


def send_run_job(app: Celery, job_id: str) -> None:
    """Ask a worker to run the job. Sending twice is harmless (the claim is a compare-and-set)."""
    app.send_task(RUN_JOB_TASK, args=[job_id], queue=TRAINING_QUEUE)
