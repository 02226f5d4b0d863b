"""Run the Triton kernels on the CPU through Triton's interpreter.

Triton reads TRITON_INTERPRET when it is imported (triton.language's own jit functions) and
when each kernel is decorated, so the interpreter works only in a process where the variable
was set before the first `import triton`. Two cases:

- Triton not imported yet (`pytest tests/kernels`), or imported with the variable set: the
  variable is set just long enough to import Triton and the kernel modules, then put back, and
  the tests run here. Nothing later in the process sees the variable.
- Triton already imported in compiled mode (the whole suite: transformers imports Triton while
  tests/engine is collected): the kernel tests are left out here and test_interpreter_child.py
  runs this directory in a child pytest whose environment sets the variable from the start.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

CHILD_RUNNER = "test_interpreter_child.py"
RUN_IN_THIS_PROCESS = os.environ.get("TRITON_INTERPRET") == "1" or "triton" not in sys.modules

if RUN_IN_THIS_PROCESS:
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.experimental.gluon  # noqa: F401  (a launch imports it lazily and checks the variable then)

        import loraloom.kernels.fp8_gemm  # noqa: F401
        import loraloom.kernels.fp8_quant  # noqa: F401
        import loraloom.kernels.norm  # noqa: F401
        import loraloom.kernels.paged_attention  # noqa: F401
        import loraloom.kernels.paged_decode  # noqa: F401
        import loraloom.kernels.rotary  # noqa: F401
        import loraloom.kernels.sgmv  # noqa: F401
    finally:
        if _previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _previous


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Collect either the kernel tests (interpreter usable here) or the child runner, never both."""
    if collection_path.parent != Path(__file__).parent or not collection_path.name.startswith("test_"):
        return None
    is_child_runner = collection_path.name == CHILD_RUNNER
    if is_child_runner == RUN_IN_THIS_PROCESS:
        return True
    return None
