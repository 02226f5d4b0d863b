"""benchmarks/gpu_checklist.sh, the one command a lent GPU machine runs: its --dry-run passes here,
in the GPU machine's kind of interpreter (no install, tests/benchmarks/gpu_machine.py), and fails on
what would waste device time: a step whose script is gone or whose arguments its script refuses. A
spent budget skips steps and says how to run them; the memory check of the suite's engines refuses
sizes no lent GPU holds."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from gpu_machine import ISOLATED_PYTHON, isolated_env

REPO = Path(__file__).resolve().parents[2]
CHECKLIST = Path("benchmarks") / "gpu_checklist.sh"
STEP_NAMES = ["gpu-tests", "suite-kernels", "fp8-sweep", "sweep-decode", "suite-part1", "suite-mixed",
              "suite-offline", "suite-zipf-peer", "suite-fp8-1term"]


def checklist(root: Path, *args: str, python: list[str] = ISOLATED_PYTHON) -> subprocess.CompletedProcess[str]:
    env = {**isolated_env(), "PYTHON": " ".join(python)}
    return subprocess.run(["bash", str(root / CHECKLIST), *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=240)


def rows(stdout: str) -> dict[str, list[str]]:
    """step name -> the rest of its row, for the rows that name a step."""
    return {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.split()[:1] in
            [[name] for name in STEP_NAMES]}


def test_the_dry_run_passes_every_step_without_an_install():
    result = checklist(REPO, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    found = rows(result.stdout)
    assert list(found) == STEP_NAMES  # every step, in the checklist's order
    assert all(row[0] == "ok" for row in found.values()), result.stdout
    assert "dry run passed: 9 steps" in result.stdout
    assert "Llama-3.1-8B shape" in " ".join(found["suite-part1"]) and "GB of" in " ".join(found["suite-part1"])


@pytest.fixture
def tree_copy(tmp_path) -> Path:
    """benchmarks/ copied (to break), the packages and tests linked: the checklist runs from the copy."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("engine", "kernels", "tests"):
        (tmp_path / folder).symlink_to(REPO / folder)
    return tmp_path


def test_a_step_whose_script_is_gone_fails_the_dry_run_and_the_others_still_run(tree_copy):
    (tree_copy / "benchmarks" / "sweep_decode.py").unlink()
    result = checklist(tree_copy, "--dry-run", "--steps", "sweep-decode,suite-mixed")
    assert result.returncode == 1
    found = rows(result.stdout)
    assert found["sweep-decode"][0] == "FAIL" and "no such script" in " ".join(found["sweep-decode"])
    assert found["suite-mixed"][0] == "ok"
    assert "dry run failed: sweep-decode" in result.stdout


def test_arguments_a_script_refuses_fail_the_dry_run(tree_copy):
    script = tree_copy / CHECKLIST
    text = script.read_text()
    broken = (text.replace("--scenarios mixed ", "--scenarios mixd ")
              .replace("fp8_sweep.py --quick", "fp8_sweep.py --quik"))
    assert broken != text
    script.write_text(broken)
    result = checklist(tree_copy, "--dry-run", "--steps", "suite-mixed,fp8-sweep,sweep-decode")
    assert result.returncode == 1
    found = rows(result.stdout)
    assert found["suite-mixed"][0] == "FAIL" and "mixd" in " ".join(found["suite-mixed"])
    assert found["fp8-sweep"][0] == "FAIL" and "--quik" in " ".join(found["fp8-sweep"])
    assert found["sweep-decode"][0] == "ok"


def test_a_spent_budget_skips_every_step_and_prints_the_command_that_runs_them(tmp_path):
    # `false` as the interpreter: a step started anyway would show as FAIL(1).
    result = checklist(REPO, "--budget", "0", "--out", str(tmp_path), python=["false"])
    assert result.returncode == 0, result.stdout + result.stderr
    found = {line.split()[2]: line.split()[3] for line in result.stdout.splitlines()
             if line.startswith("checklist done:") and line.split()[2] in STEP_NAMES}
    assert found == {name: "skipped" for name in STEP_NAMES}
    assert f"benchmarks/gpu_checklist.sh --steps {','.join(STEP_NAMES)}" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--steps", "gpu-tests,nosuch"], "no step 'nosuch'"),
    (["--budget", "seven"], "--budget takes whole seconds"),
    (["--fast"], "unknown argument '--fast'"),
])
def test_bad_arguments_are_refused_by_name(args, message):
    result = checklist(REPO, *args)
    assert result.returncode == 2 and message in result.stderr


@pytest.fixture
def fit(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from gpusuite import fit, shapes

    return fit, shapes.LLAMA_3_1_8B


def test_the_served_weights_are_what_the_gpu_notes_count(fit):
    fit, llama = fit
    # The notes' count for the FP8 base: 6.98 GB of FP8 projections + 1.05 GB of BF16 lm_head, and the
    # input embeddings (not read per step, but resident) are another 1.05 GB.
    assert fit.served_weight_bytes(llama, torch.bfloat16, quantized=True) == pytest.approx(6.98e9 + 2 * 1.05e9,
                                                                                            rel=0.01)


def test_an_engine_no_lent_gpu_holds_is_refused(fit):
    fit, llama = fit
    suite_size = fit.EngineSize(max_loras=64, max_lora_rank=16, max_num_seqs=1024)
    assert fit.engine_fit(llama, torch.bfloat16, True, suite_size, requests=256, tokens_each=579).fits
    too_many_slots = fit.EngineSize(max_loras=512, max_lora_rank=64, max_num_seqs=1024)
    refused = fit.engine_fit(llama, torch.bfloat16, True, too_many_slots, requests=256, tokens_each=579)
    assert not refused.fits and refused.total_bytes > refused.budget_bytes
