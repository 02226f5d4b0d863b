"""A build of the CPU extension killed halfway must not hang every later engine start.

torch guards its extension builds with a plain `lock` file it deletes when done; a process killed
mid-build leaves it, and torch's next load waits for it to vanish, forever. kernels/cpu_extension.py
holds an flock around the build (released by the kernel when its holder dies) and clears the
leftover baton while holding it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from loraloom.kernels.cpu_extension import TORCH_BATON, exclusive_build

# Enters the build lock, writes torch's baton as a build does, says so, then waits to be killed.
_BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from loraloom.kernels.cpu_extension import TORCH_BATON, exclusive_build
    directory = Path(sys.argv[1])
    with exclusive_build(directory):
        (directory / TORCH_BATON).write_text("")
        print("building", flush=True)
        sys.stdin.read()
""")


def test_a_baton_left_by_a_killed_build_is_cleared(tmp_path):
    builder = subprocess.Popen([sys.executable, "-c", _BUILDER, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline().strip() == "building"
    finally:
        os.kill(builder.pid, signal.SIGKILL)
        builder.wait(timeout=30)
    assert (tmp_path / TORCH_BATON).exists()  # what the killed build left behind

    with exclusive_build(tmp_path):  # returns at once: the dead holder's flock went with it
        assert not (tmp_path / TORCH_BATON).exists()


def test_a_live_build_keeps_its_baton(tmp_path):
    """The baton of a build still running is not touched: only the flock's holder may clear it."""
    builder = subprocess.Popen([sys.executable, "-c", _BUILDER, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline().strip() == "building"
        probe = subprocess.run(
            [sys.executable, "-c", "import fcntl, sys; h = open(sys.argv[1], 'w');"
             "fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(tmp_path / "build.flock")],
            capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and "BlockingIOError" in probe.stderr  # the live build holds the lock
        assert (tmp_path / TORCH_BATON).exists()
    finally:
        builder.communicate(input="", timeout=30)  # end of stdin: the build finishes normally
    assert builder.returncode == 0
