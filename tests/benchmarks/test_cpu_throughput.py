"""benchmarks/cpu_throughput.py (run by `make bench`) on a tiny run: it serves the requests through
loraloom, prints the rate, and ends with the host-overhead line (a change to
benchmarks/host_overhead.py once broke that last part unseen)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cpu_throughput.py"


def test_the_cpu_benchmark_prints_its_rate_and_the_host_overhead(model_dir: Path) -> None:
    # --skip-peer: the HF+PEFT half is plain transformers code and doubles the test's time.
    command = [sys.executable, str(SCRIPT), "--requests", "3", "--adapters", "2", "--new-tokens", "4", "--skip-peer",
               "--overhead-requests", "8", "--overhead-adapters", "2", "--overhead-steps", "2", "--overhead-tenants", "3"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    ours = re.search(r"loraloom +: (\d+) tokens in ([\d.]+) s", result.stdout)
    assert ours and int(ours.group(1)) == 3 * 4, result.stdout
    overhead = re.search(r"decode step at (\d+) running over 2 adapters .* host overhead total ([\d.]+)", result.stdout)
    assert overhead, result.stdout
    assert int(overhead.group(1)) == 8 and float(overhead.group(2)) > 0
