"""benchmarks/decode_ratio.py on a tiny run: it times decode steps with adapters and on the base
model and prints their ratio, consistent with the two step times it prints."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "decode_ratio.py"


def test_the_decode_benchmark_prints_each_batch_and_a_consistent_ratio(model_dir: Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--batches", "1", "3", "--rounds", "1", "--new-tokens", "6"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    rows = re.findall(r"batch +(\d+): decode step +([\d.]+) ms with \d+ distinct adapters, +([\d.]+) ms on the "
                      r"base model: ratio ([\d.]+)", result.stdout)
    assert [batch for batch, *_ in rows] == ["1", "3"]
    for _, adapters, base, ratio in rows:
        assert float(adapters) > 0 and float(base) > 0
        assert abs(float(ratio) - float(base) / float(adapters)) < 0.01
