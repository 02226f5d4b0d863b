"""A real `loraloom serve` process on the tiny base, with its training worker, and a view of the
processes under it through /proc (Linux), for the tests that kill them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from live_api import bearer, make_key, served_url
from training_live import wait_for, worker_environment

from loraloom.platform.settings import Settings

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script
START_TIMEOUT_S = 180  # two shared, busy cores


@dataclass
class ServeProcess:
    process: subprocess.Popen
    url: str
    key: str  # a developer key of tenant acme
    log: Path
    workers_seen: set[int] = field(default_factory=set)  # process groups to kill at the end

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.key), timeout=60)

    def training_health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()["training"]

    def worker_pid(self) -> int | None:
        """The `loraloom worker` serve started, if one runs now."""
        workers = [pid for pid in children(self.process.pid) if "worker" in cmdline(pid)]
        self.workers_seen.update(workers)
        return workers[0] if len(workers) == 1 else None

    def wait_worker_up(self, timeout_s: float = START_TIMEOUT_S) -> int:
        return wait_for(lambda: self.training_health()["worker"] == "up" and self.worker_pid(),
                        "serve's training worker to be up", timeout_s, self.log)

    def wait_worker_group(self, timeout_s: float = START_TIMEOUT_S) -> tuple[int, list[int]]:
        """The worker's pid and its process group once complete: the main process, its pool child, its reaper."""
        worker = self.wait_worker_up(timeout_s)

        def complete() -> list[int]:
            found = children(worker)
            has_pool = any(cmdline(pid) == cmdline(worker) for pid in found)  # forked: the same command line
            has_reaper = any("multiprocessing" in cmdline(pid) for pid in found)  # spawned
            return found if has_pool and has_reaper else []

        return worker, [worker, *wait_for(complete, "the worker's pool child and reaper", timeout_s, self.log)]


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            found += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except FileNotFoundError:  # the process is gone
        return []
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """Every live process of the process group `pgid` (a worker's: its main, job child, reaper)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


@contextmanager
def serve_process(settings: Settings, model_dir: Path, log: Path, *, worker: bool = True) -> Iterator[ServeProcess]:
    """`loraloom serve --model model_dir` with `settings` (as LORALOOM_* variables), in its own process
    group, with its worker up (or --no-worker); whatever of it is left is SIGKILLed when the block ends."""
    key = make_key(settings, tenant="acme", role="developer")
    process = subprocess.Popen(
        [str(LORALOOM), "serve", "--model", str(model_dir), "--port", "0", "--num-kv-blocks", "16",
         *([] if worker else ["--no-worker"])],
        env=worker_environment(settings), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    live = None
    try:
        live = ServeProcess(process=process, url=served_url(process, log, START_TIMEOUT_S), key=key, log=log)
        if worker:
            live.wait_worker_up()
        yield live
    finally:
        workers = live.workers_seen if live is not None else set()
        for pgid in [process.pid, *workers, *children(process.pid)]:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        process.wait(timeout=60)
