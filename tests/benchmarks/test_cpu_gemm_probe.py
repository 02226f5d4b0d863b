"""benchmarks/cpu_gemm_probe.py: its probe kernel's product matches torch's matmul before anything is timed,
every shape and row count gets its timings, and row counts the kernel cannot take are refused by name."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from cpu_gemm_probe import has_avx512  # noqa: E402

SCRIPT = REPO / "benchmarks" / "cpu_gemm_probe.py"


def run_probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.skipif(not has_avx512(), reason="the probe kernel is AVX-512 code")
def test_the_probe_checks_its_product_and_times_every_shape_and_row_count() -> None:
    result = run_probe("--rows", "8", "16", "--layers", "2", "--lora-bytes", "0.5")
    assert result.returncode == 0, f"probe failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "wrong" not in result.stdout
    rows = re.findall(r"M +(\d+): MKL +([\d.]+) +oneDNN packed +([\d.]+) +probe +([\d.]+) .*"
                      r"read after +([\d.]+), prefetched inside +([\d.]+) \(max error vs MKL ([\d.e+-]+)\)",
                      result.stdout)
    assert [row[0] for row in rows] == ["8", "16", "8", "16"]  # two shapes, two row counts each
    assert all(float(ms) > 0 for row in rows for ms in row[1:6])
    assert all(float(row[6]) < 1e-2 for row in rows)


def test_row_counts_the_kernel_cannot_take_are_refused() -> None:
    result = run_probe("--rows", "12")
    if "no AVX-512" in result.stdout:
        pytest.skip("no AVX-512: the probe measures nothing before checking its arguments' use")
    assert result.returncode != 0
    assert "--rows must be positive multiples of 8" in result.stderr and "12" in result.stderr
