"""Run the suite's groups (pytest folders or files, and plain commands) a few at a time: `make test`.

    python tests/run_folders.py [--jobs 2] [--pytest-args '-m "not slow"'] [--logs DIR]
                                [--command NAME=SHELL]... [--alone GROUP]... [--apart GROUP]... GROUP...

Each group runs in a process of its own, as the Makefile always ran them (a process gives its memory
back when it ends; the whole suite in one process outgrew a 24 GiB machine). Several run at once
because most groups spend much of their time waiting: on a server or worker starting, a Celery job,
Chromium, Ray. Groups start in the order given, so list the longest first and the lanes end together.

`--alone GROUP` runs a group with no other beside it (one that keeps both cores busy by itself, or needs
most of the memory), on as many torch threads as it would take alone. Alone groups start first, before
the groups listed ahead of them: started later, they would idle every lane but one while the groups
before them drained. With more than one group at a time, each other group's torch runs on one thread
(OMP_NUM_THREADS=1, unless it is set already): two
processes of two OpenMP threads each on two cores spin in each other's way, and a step waits at every
barrier for a thread that has no core (see tests/benchmarks/test_gpu_suite_cpu.py). Tests that need
several threads set their count themselves.

`--apart GROUP` marks a group that needs much memory (servers and engines of its own): two such groups
never run at once, and a lighter group waiting behind them may start first instead. Two at once is what
ran a 24 GiB machine out of memory (the API's and the registry's groups, ~10 GiB each).

The runner prints each group's wall time, CPU time (its processes' and those they waited for) and peak
memory (every process of its session, summed, sampled twice a second).

A group's output goes to <DIR>/<group>.log (default .cache/test-logs) and is printed whole when the
group ends, never interleaved with another's. The run fails if any group failed (pytest's exit status 5,
"nothing collected", is not a failure: a folder can be all `slow`); the failed groups are named last.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOGS = REPO / ".cache" / "test-logs"
NOTHING_COLLECTED = 5


@dataclass
class Group:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    status: int | None = None
    peak_bytes: int = 0
    cpu_seconds: float = 0.0
    alone: bool = False  # runs with no other group beside it, on every thread torch wants
    apart: bool = False  # memory-heavy: never beside another such group

    def ended(self) -> bool:
        """Reap the group's process if it ended, keeping its exit status and the CPU time it and every
        process it waited for used (wait4's rusage): a group whose CPU time is near its wall time keeps
        a core busy; one far below it mostly waits, and can share the machine."""
        if self.status is not None:
            return True
        pid, wait_status, usage = os.wait4(self.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.status = self.process.returncode = os.waitstatus_to_exitcode(wait_status)
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return True

    @property
    def failed(self) -> bool:
        return self.status not in (0, NOTHING_COLLECTED)


LOG_NAME_LIMIT = 120  # file systems refuse names past 255 bytes; a group of several targets gets long


def log_path(logs: Path, name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
    if len(stem) > LOG_NAME_LIMIT:  # cut, with a digest of the whole name to keep two such groups apart
        stem = f"{stem[:LOG_NAME_LIMIT]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return logs / f"{stem}.log"


def parse_groups(argv: list[str] | None) -> tuple[int, list[Group]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*",
                        help="pytest targets, one process each (several in one process: separated by spaces)")
    parser.add_argument("--jobs", type=int, default=2, help="groups running at once")
    parser.add_argument("--pytest-args", default="", help="arguments for every pytest group (shell words)")
    parser.add_argument("--command", action="append", default=[], metavar="NAME=SHELL",
                        help="a group that is a shell command instead of a pytest target")
    parser.add_argument("--alone", action="append", default=[], metavar="GROUP",
                        help="a group (one of the targets) that runs with no other beside it: one that keeps both "
                             "cores busy by itself, or needs most of the memory")
    parser.add_argument("--apart", action="append", default=[], metavar="GROUP",
                        help="a group (one of the targets) that needs much memory: never two of them at once")
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="where each group's output is kept")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    groups = []
    for name_and_command in args.command:
        name, separator, command = name_and_command.partition("=")
        if not separator or not name or not command:
            parser.error(f"--command takes NAME=SHELL, not {name_and_command!r}")
        groups.append(Group(name, ["bash", "-c", command], log_path(args.logs, name)))
    pytest_args = shlex.split(args.pytest_args)
    for target in args.targets:
        argv = [sys.executable, "-m", "pytest", "-q", *pytest_args, *target.split()]
        groups.append(Group(target, argv, log_path(args.logs, target)))
    if not groups:
        parser.error("no groups to run")
    for flag, names in (("--alone", args.alone), ("--apart", args.apart)):
        unknown = set(names) - {group.name for group in groups}
        if unknown:
            parser.error(f"{flag} names groups that are not run: {sorted(unknown)}")
    for group in groups:
        group.alone = group.name in args.alone
        group.apart = group.name in args.apart
    return args.jobs, groups


def group_environment(jobs: int, alone: bool) -> dict[str, str]:
    env = dict(os.environ)
    if jobs > 1 and not alone:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def may_start(group: Group, running: list[Group], jobs: int) -> bool:
    if group.alone:
        return not running
    if len(running) >= jobs or any(other.alone for other in running):
        return False
    return not (group.apart and any(other.apart for other in running))


def next_to_start(waiting: list[Group], running: list[Group], jobs: int) -> Group | None:
    """The first waiting group that may start now. A group kept apart from a running one lets those behind
    it pass; an alone group lets none pass, or it could wait for ever behind a stream of others."""
    for group in waiting:
        if may_start(group, running, jobs):
            return group
        if group.alone or len(running) >= jobs:
            return None
    return None


def start(group: Group, jobs: int) -> None:
    env = group_environment(jobs, group.alone)
    group.log.parent.mkdir(parents=True, exist_ok=True)
    with open(group.log, "wb") as log:
        # A session of its own, so that an interrupted run can end the group with everything it started.
        group.process = subprocess.Popen(group.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
    group.started = time.monotonic()


def resident_bytes(session: int) -> int:
    """The memory every process of a session holds now: a group's pytest and whatever it started (servers,
    workers, Chromium), which is what two groups side by side must fit in."""
    total = 0
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) == session:
                total += process.memory_info().rss
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue  # it ended meanwhile
    return total


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def report(group: Group) -> None:
    outcome = "FAILED" if group.failed else "passed"
    print(f"== {group.name}: {outcome} (exit {group.status}) in {group.seconds:.0f} s, "
          f"{group.cpu_seconds:.0f} s of CPU, peak {gib(group.peak_bytes)}", flush=True)
    sys.stdout.write(group.log.read_text(errors="replace"))
    sys.stdout.flush()


def run(jobs: int, groups: list[Group]) -> bool:
    """Run every group in the order given, at most `jobs` at once, `alone` ones by themselves and `apart`
    ones one at a time; True if none failed."""
    waiting = sorted(groups, key=lambda group: not group.alone)  # stable: the given order otherwise
    running: list[Group] = []
    while waiting or running:
        while (group := next_to_start(waiting, running, jobs)) is not None:
            waiting.remove(group)
            start(group, jobs)
            running.append(group)
        time.sleep(0.5)
        for group in running:
            group.peak_bytes = max(group.peak_bytes, resident_bytes(group.process.pid))
        for group in [g for g in running if g.ended()]:
            group.seconds = time.monotonic() - group.started
            running.remove(group)
            report(group)
    return not any(group.failed for group in groups)


def stop(groups: list[Group]) -> None:
    for group in groups:
        if group.process is not None and group.process.poll() is None:
            try:
                os.killpg(group.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a CI runner's SIGTERM ends the groups too, as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    jobs, groups = parse_groups(argv)
    signal.signal(signal.SIGTERM, interrupted)
    began = time.monotonic()
    try:
        passed = run(jobs, groups)
    except KeyboardInterrupt:
        stop(groups)
        return 130
    print(f"== {len(groups)} groups, {jobs} at a time, in {time.monotonic() - began:.0f} s:")
    for group in sorted(groups, key=lambda g: (g.failed, -g.seconds)):
        print(f"   {'FAILED' if group.failed else 'passed'} {group.seconds:6.0f} s {group.cpu_seconds:6.0f} cpu "
              f"{gib(group.peak_bytes):>9}  {group.name}  ({group.log})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
