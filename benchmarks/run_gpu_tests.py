"""Run the CUDA-only tests on the GPU machine, where loraloom is not pip-installed.

    python benchmarks/run_gpu_tests.py [pytest args]   (default: the tests that need a GPU)
    python benchmarks/run_gpu_tests.py --dry-run       (no GPU: collect them, so a renamed test fails here)

Not tests/kernels: its conftest imports the kernels under Triton's interpreter (the CPU test
path), and they would then run interpreted in this process too. The source tree's engine/ and
kernels/ are registered as loraloom.engine / loraloom.kernels (benchmarks/_loraloom_shim.py),
then pytest runs; the platform package is not needed.
"""
from __future__ import annotations

import contextlib
import io
import sys

import _loraloom_shim

_loraloom_shim.use_source_tree()

import pytest  # noqa: E402

GPU_TESTS = [
    "tests/engine/test_cuda.py",
    "tests/engine/model/test_fp8_numerics.py::test_fp8_linear_on_cuda_equals_the_reference",
    "tests/engine/model/test_fp8_numerics.py::test_two_term_fp8_linear_on_cuda_equals_the_cpu_reference",
]
PYTEST_FLAGS = ["-q", "-p", "no:cacheprovider"]


def dry_run(argv: list[str]) -> str:
    """Collect what a run with `argv` would run (its tests import, and every named test exists)."""
    selected = [arg for arg in argv if arg != "--dry-run"] or GPU_TESTS
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        status = pytest.main([*PYTEST_FLAGS, "-q", "--collect-only", *selected])  # -qq: one count per file
    lines = [line for line in report.getvalue().splitlines() if line.strip()]
    if status != pytest.ExitCode.OK:
        raise ValueError(f"collecting {selected}: pytest exit status {int(status)}: {' / '.join(lines[-3:])}")
    return f"{len(selected)} selections collect: {', '.join(lines)}"


if __name__ == "__main__":
    if "--dry-run" in sys.argv[1:]:
        print(dry_run(sys.argv[1:]))
        sys.exit(0)
    sys.exit(pytest.main([*PYTEST_FLAGS, *(sys.argv[1:] or GPU_TESTS)]))
