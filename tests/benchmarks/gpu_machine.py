"""The GPU machine's interpreter, imitated here: a copy of the tree and no `pip install`.

Started with -S and only the virtualenv's site-packages on PYTHONPATH, Python never processes the
editable install's .pth file (the only thing that makes `loraloom` importable here), so torch,
transformers and peft import but loraloom does not, and the benchmarks have to map engine/ and
kernels/ themselves, as they do on that machine. One OpenMP thread: on a shared two-core CI machine,
two spinning OpenMP threads per process stall each other."""
from __future__ import annotations

import os
import sys
import sysconfig

ISOLATED_PYTHON = [sys.executable, "-S"]


def isolated_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    site_packages = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env.update(PYTHONPATH=os.pathsep.join(sorted(site_packages)), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return env
