"""benchmarks/gpusuite/sgmv_sweep.py in its --cpu mode (tiny shapes, Triton interpreter): it runs,
checks every variant against the reference, and reports a best config for every shape."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "benchmarks" / "gpusuite" / "sgmv_sweep.py"


def test_cpu_sweep_checks_times_and_ranks_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    result = subprocess.run([sys.executable, str(SWEEP), "--cpu", "--json", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"sweep failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    results = json.loads(out.read_text())["results"]
    shapes = {(r["workload"], r["module"]) for r in results}
    assert len(shapes) == 3 * 4  # every CPU workload x qkv, o, gate_up, down
    for op in ("shrink", "expand"):
        configs = {r["config"] for r in results if r["op"] == op}
        assert len(configs) >= 2
        assert len([r for r in results if r["op"] == op]) == len(shapes) * len(configs)
    assert all(r["passed"] and r["gbps"] > 0 for r in results)
    assert result.stdout.count("best geometric mean over shapes: [") == 2
