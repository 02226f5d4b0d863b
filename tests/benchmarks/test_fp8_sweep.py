"""benchmarks/gpusuite/fp8_sweep.py --cpu: the sweep's checks run (tiny shapes, Triton interpreter) and pass.

On a CPU the sweep only checks: every small-M config at every token count against the reference
and the quantization kernel bit for bit; the timing half needs CUDA."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "gpusuite" / "fp8_sweep.py"


def test_fp8_sweep_cpu_mode_checks_every_variant_and_passes() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself, before importing Triton
    result = subprocess.run([sys.executable, str(SWEEP), "--cpu"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"fp8_sweep --cpu failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "checks passed" in result.stdout and "FAIL" not in result.stdout
