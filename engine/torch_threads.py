"""Which threads of a serving process run torch with more than one thread: the step thread alone.

torch's CPU ops run on OpenMP (libgomp on Linux), and libgomp gives every thread that enters a
parallel region a pool of worker threads of its own, kept for the life of the process. Once the
workers of all pools outnumber the cores, libgomp stops them spinning between regions: each of
the hundreds of parallel regions in an engine step then waits for its workers to wake. Measured
on a 2-core machine, one multi-threaded `torch.sum` on the main thread before the engine stepped
on its own thread made every step 20-30% slower for as long as the process ran, and so would an
adapter validated on a fetch thread, or an upload checked on a request thread.

So a server gives the step thread all of torch's threads and every other thread one: a thread
with one torch thread runs its ops inline and starts no pool. torch.set_num_threads sets the
calling thread's count and the default that threads take when they first use torch.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import torch

_reserved: int | None = None  # torch's thread count before reserve_for_step_thread, once called


def reserve_for_step_thread() -> None:
    """For a serving process, on its main thread before it starts threads: every thread other than an
    engine's step thread runs torch ops on one thread from now on. Keeps torch's count for the step thread."""
    global _reserved
    if _reserved is None:
        _reserved = torch.get_num_threads()
    torch.set_num_threads(1)


def step_thread_count() -> int:
    """The torch threads a step thread gets: what torch had before the reservation, else the caller's count."""
    return _reserved if _reserved is not None else torch.get_num_threads()


def set_thread_count(count: int) -> None:
    """This thread's torch threads. torch's first use on a thread sets its count to the process default,
    overriding an earlier set_num_threads: that first use is made here, before the count is set."""
    torch.get_num_threads()
    torch.set_num_threads(count)


def one_torch_thread() -> None:
    """Initializer for a helper thread (adapter fetches, grammar compiles): torch ops run inline there."""
    set_thread_count(1)


class StepThread:
    """One daemon thread with all of the step's torch threads, running the calls given to it in order:
    an engine's construction, then its step loop, so that no other thread needs a pool of workers.
    A daemon, as the step thread always was: a process that exits without stopping its engine exits."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, args=(step_thread_count(),), name=name, daemon=True)
        self._thread.start()
        self.submit(lambda: None).result()  # the thread has set its count
        if _reserved is not None:
            set_thread_count(1)  # that also set the default of threads started later: one again

    def submit(self, call: Callable, *args) -> Future:
        future: Future = Future()
        self._calls.put((future, call, args))
        return future

    def stop(self) -> None:
        """Ends the thread once the calls given before have returned."""
        self._calls.put(None)
        self._thread.join()

    def _serve(self, threads: int) -> None:
        set_thread_count(threads)
        while (item := self._calls.get()) is not None:
            future, call, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call(*args))
                except BaseException as error:  # handed to whoever waits on the future
                    future.set_exception(error)
