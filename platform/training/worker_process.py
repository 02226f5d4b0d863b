"""A `loraloom worker` started by `serve`, as one process group: the worker's main process, the
job child it forks and its reaper. Stopping the worker stops all of them; a child left behind
would go on training (or consuming from the broker) with nobody to report to."""
from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import time

from loraloom.platform.training.worker import end_with_parent

logger = logging.getLogger(__name__)


class WorkerProcess:
    def __init__(self, command: list[str]) -> None:
        # Its own session, hence its own process group, which signals reach as a whole. SIGKILL when
        # the starting thread dies: a serve killed by SIGKILL takes its worker along (the worker's own
        # children end with it in turn, see worker.py).
        self.popen = subprocess.Popen(command, start_new_session=True,
                                      preexec_fn=functools.partial(end_with_parent, signal.SIGKILL, os.getpid()))
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None  # poll() also reaps an exited worker: no zombie stays

    def stop(self, timeout_s: float) -> None:
        """Celery's warm shutdown (the worker stops consuming, its job finishes the step it is on), then
        SIGKILL for whatever of the group is left after `timeout_s`. A job cut off is requeued by a
        reaper and resumes from its last checkpoint."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("training worker %d did not stop within %.0f s: killing it", self.pid, timeout_s)
        self.kill()

    def kill(self) -> None:
        """SIGKILL every process of the group, the main one's exit notwithstanding (its children may live on)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # the whole group is gone already
            pass
        self.popen.wait()
