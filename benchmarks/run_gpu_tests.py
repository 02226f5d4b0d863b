"""Run the CUDA-only tests on the GPU machine, where loraloom is not pip-installed.

    python benchmarks/run_gpu_tests.py [pytest args]   (default: the tests that need a GPU)

Not tests/kernels: its conftest imports the kernels under Triton's interpreter (the CPU test
path), and they would then run interpreted in this process too. The source tree's engine/ and
kernels/ are registered as loraloom.engine / loraloom.kernels (benchmarks/_loraloom_shim.py),
then pytest runs; the platform package is not needed.
"""
from __future__ import annotations

import sys

import _loraloom_shim

_loraloom_shim.use_source_tree()

import pytest  # noqa: E402

GPU_TESTS = [
    "tests/engine/test_cuda.py",
    "tests/engine/model/test_fp8.py::test_scaled_mm_on_cuda_equals_the_reference",
]

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *(sys.argv[1:] or GPU_TESTS)]))
