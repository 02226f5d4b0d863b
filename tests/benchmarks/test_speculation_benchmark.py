"""benchmarks/speculation.py on its --quick run: both servers (--speculation auto and off) answer every
workload, the table has a line per workload and batch, and every output is identical between the modes
(the benchmark exits 1 on any difference). No timing is asserted: --quick's figures mean nothing."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "speculation.py"
ROWS = [("(a) extractive", 1), ("(a) extractive", 8), ("(b) templated", 1), ("(c) chat", 1), ("(c) chat", 8)]


def test_the_speculation_benchmark_prints_every_workload_with_identical_outputs(model_dir: Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=REPO, capture_output=True, text=True,
                            timeout=900)  # two servers and their adapters on a slow, busy 2-core VM
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-4000:]}\n{result.stderr[-3000:]}"
    for label, batch in ROWS:
        line = re.search(rf"^{re.escape(label)} +{batch} +([\d.]+) +([\d.]+) +([\d.]+)x .* (\d+)/(\d+) identical",
                         result.stdout, re.MULTILINE)
        assert line, f"no table line for {label} batch {batch}:\n{result.stdout}"
        off, auto, _, identical, sent = line.groups()
        assert float(off) > 0 and float(auto) > 0
        assert identical == sent and int(sent) >= batch, line.group(0)
    # The drafts are counted on the auto server: at least the templated set, whose answer store was
    # filled by the warm-up, proposes tokens.
    templated = re.search(r"^\(b\) templated .* (\d+)% \((\d+)/(\d+)\)", result.stdout, re.MULTILINE)
    assert templated and int(templated.group(3)) > 0, result.stdout
    assert "every output identical between --speculation auto and off" in result.stdout
