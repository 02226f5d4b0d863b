"""The kernel tests, run in a child pytest with TRITON_INTERPRET=1 from the start.

Collected only when this process imported Triton in compiled mode before tests/kernels was
reached (see conftest.py); otherwise the kernel tests run directly and this file is skipped.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_kernel_tests_pass_under_the_interpreter() -> None:
    here = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here)],
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=here.parent.parent,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, (
        f"tests/kernels failed under the Triton interpreter:\n{result.stdout[-8000:]}\n{result.stderr[-2000:]}")
