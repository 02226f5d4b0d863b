"""A full server answers 503 at once instead of queueing without end: past a bound on the requests
waiting in the engine, inference is refused with a Retry-After of about how long the engine takes
to work through the excess at its recent pace (requests finished per second, over the last
THROUGHPUT_WINDOW_S)."""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from loraloom.engine import EngineStats
from loraloom.platform.api.errors import SERVER_ERROR, APIError

# The default bound: this many waiting requests per running slot (the engine's max_num_seqs, which
# `loraloom serve` knows; an app built without it assumes the engine's default of 256).
OVERLOAD_WAITING_PER_SEQ = 4
ASSUMED_MAX_NUM_SEQS = 256
THROUGHPUT_WINDOW_S = 30.0
MIN_RETRY_S, MAX_RETRY_S = 1, 60
UNKNOWN_PACE_RETRY_S = 5  # nothing finished lately to measure by


def default_max_waiting(max_num_seqs: int = ASSUMED_MAX_NUM_SEQS) -> int:
    return OVERLOAD_WAITING_PER_SEQ * max_num_seqs


class OverloadGuard:
    def __init__(self, max_waiting: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_waiting = max_waiting
        self.clock = clock
        self._finished: deque[float] = deque()  # when recent requests ended

    def note_finished(self) -> None:
        now = self.clock()
        self._finished.append(now)
        self._forget_before(now - THROUGHPUT_WINDOW_S)

    def _forget_before(self, cutoff: float) -> None:
        while self._finished and self._finished[0] < cutoff:
            self._finished.popleft()

    def retry_after_s(self, waiting: int) -> int:
        now = self.clock()
        self._forget_before(now - THROUGHPUT_WINDOW_S)
        if not self._finished:
            return UNKNOWN_PACE_RETRY_S
        pace = len(self._finished) / max(1.0, now - self._finished[0])  # requests per second
        excess = waiting - self.max_waiting + 1
        return min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(excess / pace)))

    def check(self, stats: EngineStats) -> None:
        """503 when more than max_waiting requests wait in the engine."""
        if stats.num_waiting <= self.max_waiting:
            return
        retry_s = self.retry_after_s(stats.num_waiting)
        raise APIError(
            503,
            f"The server is overloaded: {stats.num_waiting} requests are waiting (the most it queues is "
            f"{self.max_waiting}); retry after {retry_s} s",
            code="server_overloaded", error_type=SERVER_ERROR,
            headers={"Retry-After": str(retry_s), "retry-after-ms": str(retry_s * 1000)},
        )
