"""benchmarks/cpu_add_lora.py on three adapters of a mix given on its command line (--ranks, --modules): it
runs, times each row count, and counts the LoRA bytes a step reads as the adapters' own ranks and modules
say (computed here from the model's shape)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from served.workload import adapter_specs, lora_weights_per_decode_step  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cpu_add_lora.py"


RANKS, SUBSETS = [3, 40], [["k_proj", "up_proj"], ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"]]


def lora_bytes(model_dir: Path, count: int) -> int:
    """fp32 bytes of A [r, in] and B [out, r] for every targeted module of every layer, from the model's shape."""
    config = json.loads((model_dir / "config.json").read_text())
    return 4 * lora_weights_per_decode_step(config, adapter_specs(count, RANKS, SUBSETS))


def test_the_op_benchmark_times_each_row_count_and_counts_the_adapters_bytes(model_dir: Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--adapters", "3", "--rows", "1", "9",
                             "--ranks", "3", "40", "--modules", "k,up", "all"], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    header = re.search(r"(\d+) adapters in slots, ([\d.]+) MB of LoRA weights", result.stdout)
    assert header and int(header[1]) == 3
    assert float(header[2]) == round(lora_bytes(model_dir, 3) / 1e6, 1)
    timings = re.findall(r"(\d+) row\(s\) per adapter: +([\d.]+) ms", result.stdout)
    assert [rows for rows, _ in timings] == ["1", "9"] and all(float(ms) > 0 for _, ms in timings)
