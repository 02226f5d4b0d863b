"""The dry run of benchmarks/gpu_checklist.sh: each step's script checked on this CPU machine.

    python3 benchmarks/gpusuite/checklist_dry_run.py 'NAME|LIMIT|SCRIPT ARGS...' ...

One argument per step, as the checklist lists it. Each script is imported in this one process (one
import of torch, not one per step) and its `dry_run(argv)` is called with the step's own arguments:
the script's parser takes them or refuses them, its imports resolve against this tree, and it checks
its shapes on paper (gpu_suite: the engines fit the GPU; fp8_sweep: the GEMM configs; sweep_decode:
the kernels it calls; run_gpu_tests: its tests collect). A missing script, a refused argument or a
failed check fails the step; the exit status is 1 when any step failed.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))  # the scripts import _loraloom_shim and gpusuite from there


def load_script(path: Path, loaded: dict[Path, ModuleType]) -> ModuleType:
    """The script as a module (not __main__, so it does not run), imported once per path."""
    if path not in loaded:
        spec = importlib.util.spec_from_file_location(f"checklist_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # where dataclasses look their module up while it executes
        spec.loader.exec_module(module)
        loaded[path] = module
    return loaded[path]


def check_step(script: str, args: list[str], loaded: dict[Path, ModuleType]) -> str:
    """The script's own summary of what it would do; raises what stops the step."""
    path = REPO_ROOT / script
    if not path.is_file():
        raise FileNotFoundError(f"{script}: no such script in this tree")
    module = load_script(path, loaded)
    if not callable(getattr(module, "dry_run", None)):
        raise AttributeError(f"{script} has no dry_run(argv)")
    refusal = io.StringIO()
    own_argv, sys.argv = sys.argv, [str(path), *args]  # argparse names the script in its messages
    try:
        with contextlib.redirect_stderr(refusal):
            return module.dry_run(args)
    except SystemExit as error:  # argparse refused an argument; its message went to `refusal`
        message = refusal.getvalue().strip().splitlines()
        raise ValueError(f"arguments {shlex.join(args)} refused: {message[-1] if message else error}") from None
    finally:
        sys.argv = own_argv


def main(steps: list[str]) -> int:
    loaded: dict[Path, ModuleType] = {}
    failed = []
    print(f"{'step':<18} {'dry run':<8} {'secs':>5}  what it checks")
    for step in steps:
        name, _limit, command = step.split("|", 2)
        script, *args = shlex.split(command)
        started = time.monotonic()
        try:
            summary, status = check_step(script, args, loaded), "ok"
        except (Exception, SystemExit) as error:  # reported in the step's row; the other steps still run
            summary, status = f"{type(error).__name__}: {error}", "FAIL"
            failed.append(name)
        print(f"{name:<18} {status:<8} {time.monotonic() - started:5.1f}  {summary}", flush=True)
    if failed:
        print(f"dry run failed: {', '.join(failed)}")
        return 1
    print(f"dry run passed: {len(steps)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
