"""The compiled CPU ops (kernels/csrc/), built once per machine and loaded on demand.

They are compiled with -march=native, so they are built on the machine that runs them: `make
setup` builds them (`python -m loraloom.kernels.cpu_extension`), and a first use builds them if
setup did not. A machine without a C++ compiler, or a failed build, keeps the plain-torch
references: slower, never wrong. LORALOOM_CPU_EXTENSION=0 turns the extension off (to compare).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "module.cpp", CSRC / "packed_lora.cpp", CSRC / "overlapped_linear.cpp", CSRC / "paged_decode.cpp"]
HEADERS = [CSRC / "packed_lora.h", CSRC / "panel_matmul.h", CSRC / "torch_threads.h", CSRC / "vector_ops.h"]
# -fopenmp: the ops' threads (csrc/torch_threads.h) are torch's own OpenMP runtime (torch ships
# libgomp, and the extension binds to the copy already loaded).
# -fno-math-errno: exp() sets no errno, so loops over it vectorize (glibc's vector math library).
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]
DISABLE_ENV = "LORALOOM_CPU_EXTENSION"


def build_directory() -> Path:
    """Per source version and torch version, so an upgrade of either never loads a stale build; and
    per checkout, since torch rebuilds when the source paths change: two checkouts sharing one home
    directory would otherwise rebuild each other's build, and wait on each other's lock, at every load."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(str(CSRC.resolve()).encode())
    for source in SOURCES + HEADERS:
        digest.update(source.read_bytes())
    digest.update(" ".join(FLAGS).encode())
    # The same home as the bundled model (engine/bundled.py); kernels/ sits below engine/, so it reads the variable itself.
    root = Path(os.environ.get("LORALOOM_HOME") or Path.home() / ".cache" / "loraloom")
    return root / "cpu_extension" / digest.hexdigest()[:16]


# torch's own guard against two processes building at once: a plain file it creates and deletes. A
# process killed mid-build leaves it behind, and every later load waits on it forever.
TORCH_BATON = "lock"


@contextlib.contextmanager
def exclusive_build(directory: Path) -> Iterator[None]:
    """Hold the build directory alone, clearing a baton left by a killed build.

    The kernel releases an flock when its holder dies, so whoever holds ours is the only process that
    can be building here: a baton found then belongs to nobody and is removed instead of waited on.
    """
    with open(directory / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        baton = directory / TORCH_BATON
        if baton.exists():
            log.warning("removing %s, left by a build that was killed", baton)
            baton.unlink(missing_ok=True)
        yield


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None (disabled, no compiler, or the build failed: logged once)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    from torch.utils import cpp_extension  # imports setuptools: only when the extension is wanted

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    # torch builds with the `ninja` on PATH; the one pip installed (pyproject) sits beside this Python.
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    try:
        with exclusive_build(directory):
            return cpp_extension.load(name="loraloom_cpu_ops", sources=[str(s) for s in SOURCES],
                                      extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                                      build_directory=str(directory), verbose=False)
    except Exception as error:  # a compiler error, a missing compiler, or a linker problem
        log.warning("CPU extension unavailable, using the plain-torch LoRA path: %s", error)
        return None


if __name__ == "__main__":
    print(f"building the CPU extension in {build_directory()} ...", file=sys.stderr)
    module = load()
    if module is None:
        print("CPU extension not built: the plain-torch path will be used", file=sys.stderr)
    else:
        print(f"CPU extension ready: {module.__file__}", file=sys.stderr)
