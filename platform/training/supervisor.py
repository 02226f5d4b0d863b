"""`serve`'s training side: a thread that keeps the worker beside the server working, and jobs moving.

Every round (at most a second apart) it
- restarts the worker when it died (backing off while it keeps dying right after its start);
- reaps: requeues or fails the running jobs whose heartbeat is past the timeout. In serve's
  process, not only in the worker's reaper, which dies with its worker;
- restarts a stuck worker: jobs queued for training_dispatch_timeout_s while its worker runs
  none means the worker took their messages and runs nothing (a pool child stopped or killed
  while idle does that), or the messages were lost. Jobs that other workers run do not count:
  the worker beside serve has to take a queued job whatever the others do. The jobs are sent again after the restart;
  a duplicate message is harmless (claims are compare-and-sets).

`health()` is what GET /health reports of training. With `worker_command` None (serve
--no-worker) workers run elsewhere: the thread only reaps.
"""
from __future__ import annotations

import logging
import threading
import time

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.settings import Settings
from loraloom.platform.training.celery_app import create_celery_app, send_run_job
from loraloom.platform.training.job_state import queue_view, reap_stale_jobs
from loraloom.platform.training.worker import worker_id
from loraloom.platform.training.worker_process import WorkerProcess

logger = logging.getLogger(__name__)

MAX_ROUND_S = 1.0  # a dead worker is noticed within this long, whatever the heartbeat interval
WORKER_STOP_TIMEOUT_S = 30
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
HEALTHY_UPTIME_S = 60.0  # a worker that lived this long died of something else than its start: no backoff


class TrainingSupervisor:
    def __init__(self, settings: Settings, worker_command: list[str] | None) -> None:
        self.settings = settings
        self.worker_command = worker_command
        self.restarts = 0
        self._worker: WorkerProcess | None = None
        self._restart_at: float | None = None  # monotonic time of the next start of a dead worker
        self._backoff_s = FIRST_BACKOFF_S
        self._stalled_since: float | None = None
        self._stopping = threading.Event()
        self._stopped = False
        # The worker is started from this thread and must be: it gets SIGKILL when its starting thread ends.
        self._thread = threading.Thread(target=self._run, name="training-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker's whole process group; returns once it is gone."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def health(self) -> dict[str, object]:
        if self.worker_command is None:
            state = "external"  # serve --no-worker: training is up to workers started elsewhere
        elif self._stopped or self._worker is None:
            state = "down"
        elif self._restart_at is not None:
            state = "restarting"
        else:
            state = "up"
        return {"worker": state, "restarts": self.restarts}

    def _run(self) -> None:
        db_engine = create_db_engine(self.settings.database_url)
        factory = create_session_factory(db_engine)
        celery_app = create_celery_app(self.settings)
        round_s = min(MAX_ROUND_S, self.settings.training_heartbeat_interval_s)
        try:
            if self.worker_command is not None:
                self._worker = WorkerProcess(self.worker_command)
            while not self._stopping.wait(round_s):
                try:
                    self._round(factory, lambda job_id: send_run_job(celery_app, job_id))
                except Exception:  # the database or broker is down for now: try again next round
                    logger.exception("training supervisor: a round failed")
        finally:
            if self._worker is not None:
                self._worker.stop(WORKER_STOP_TIMEOUT_S)
            self._stopped = True
            db_engine.dispose()

    def _round(self, factory, send) -> None:
        self._watch_worker()
        for job_id, status in reap_stale_jobs(
            factory, heartbeat_timeout_s=self.settings.training_heartbeat_timeout_s, send=send
        ):
            logger.warning("job %s had a stale heartbeat: now %s", job_id, status.value,
                           extra={"job_id": job_id})
        self._watch_queue(factory, send)

    def _watch_worker(self) -> None:
        worker = self._worker
        if worker is None:
            return
        now = time.monotonic()
        if self._restart_at is None:
            if worker.alive():
                return
            worker.kill()  # what the dead main process left of its group
            if now - worker.started > HEALTHY_UPTIME_S:
                self._backoff_s = FIRST_BACKOFF_S
            logger.warning("training worker %d exited with %s; restarting it in %.0f s",
                           worker.pid, worker.popen.returncode, self._backoff_s)
            self._restart_at = now + self._backoff_s
            self._backoff_s = min(MAX_BACKOFF_S, 2 * self._backoff_s)
        elif now >= self._restart_at:
            self._restart_worker()

    def _restart_worker(self) -> None:
        assert self.worker_command is not None and self._worker is not None
        self._worker.kill()
        self._worker = WorkerProcess(self.worker_command)
        self._restart_at = None
        self._stalled_since = None
        self.restarts += 1
        logger.info("training worker restarted: pid %d", self._worker.pid)

    def _watch_queue(self, factory, send) -> None:
        if self._worker is None or self._restart_at is not None:
            self._stalled_since = None
            return
        view = queue_view(factory, worker_id(self._worker.pid))
        if not view.queued or view.active:
            self._stalled_since = None  # nothing waits, or the worker is busy: both are fine
            return
        now = time.monotonic()
        if self._stalled_since is None:
            self._stalled_since = now
            return
        if now - self._stalled_since < self.settings.training_dispatch_timeout_s:
            return
        logger.warning("%d job(s) queued for %.0f s while it runs none: the training worker %d is stuck; "
                       "restarting it", len(view.queued), now - self._stalled_since, self._worker.pid)
        self._restart_worker()
        for job_id in view.queued:  # their messages may have gone with the stuck worker
            send(job_id)
