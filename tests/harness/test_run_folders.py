"""tests/run_folders.py, what `make test` runs the groups with: each group's output whole, a failure fails
the run and is named last, "nothing collected" (pytest's exit 5) is no failure, and groups overlap."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "run_folders.py"


def run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), "--logs", str(tmp_path / "logs"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def write_tests(tmp_path: Path) -> None:
    (tmp_path / "test_good.py").write_text("def test_good():\n    print('good output')\n")
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 1 + 1 == 3, 'bad on purpose'\n")
    (tmp_path / "test_slow_only.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: left out\n")


def test_a_failing_group_fails_the_run_and_is_listed_last_with_its_output(tmp_path):
    write_tests(tmp_path)
    result = run(tmp_path, "--jobs", "2", "--pytest-args", '-m "not slow" -s', str(tmp_path / "test_bad.py"),
                 str(tmp_path / "test_good.py"), str(tmp_path / "test_slow_only.py"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "bad on purpose" in result.stdout and "good output" in result.stdout
    summary = result.stdout.split("groups, 2 at a time")[1].splitlines()[1:]
    assert [line.split()[0] for line in summary] == ["passed", "passed", "FAILED"]
    assert summary[-1].split()[7].endswith("test_bad.py")


def test_a_group_of_many_targets_gets_a_log_whose_name_the_file_system_takes(tmp_path):
    write_tests(tmp_path)
    good = str(tmp_path / "test_good.py")
    long_group = " ".join([good] + [f"--deselect={good}::test_missing_{n}" for n in range(12)])
    result = run(tmp_path, long_group)
    assert result.returncode == 0, result.stdout + result.stderr
    [log] = (tmp_path / "logs").iterdir()
    assert len(log.name) < 255 and "1 passed" in log.read_text()


def test_targets_separated_by_spaces_are_one_group(tmp_path):
    write_tests(tmp_path)
    both = f"{tmp_path / 'test_good.py'} {tmp_path / 'test_slow_only.py'}"
    result = run(tmp_path, both)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout and "== 1 groups" in result.stdout


def test_nothing_collected_and_passing_groups_pass_the_run(tmp_path):
    write_tests(tmp_path)
    result = run(tmp_path, "--pytest-args", '-m "not slow"', str(tmp_path / "test_good.py"),
                 str(tmp_path / "test_slow_only.py"), "--command", "shell=echo from a command")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(exit 5)" in result.stdout and "from a command" in result.stdout


def test_groups_run_at_the_same_time(tmp_path):
    # Each group waits for the other's file: with one lane this would never end, with two it ends at once.
    wait_for = "for i in $(seq 600); do [ -e {0} ] && exit 0; sleep 0.1; done; exit 1"
    result = run(tmp_path, "--jobs", "2",
                 "--command", f"first=touch {tmp_path}/a; " + wait_for.format(tmp_path / "b"),
                 "--command", f"second=touch {tmp_path}/b; " + wait_for.format(tmp_path / "a"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_group_s_output_is_printed_whole(tmp_path):
    lines = "; ".join(f"echo {name}-{i}; sleep 0.05" for name in ["x"] for i in range(20))
    result = run(tmp_path, "--jobs", "2", "--command", f"one={lines}",
                 "--command", f"two={lines.replace('x-', 'y-')}")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    for name in ["x", "y"]:
        first = out.index(f"{name}-0")
        assert out[first:first + 20] == [f"{name}-{i}" for i in range(20)]


def test_groups_run_side_by_side_get_one_torch_thread_unless_told_otherwise(tmp_path):
    probe = "import torch; print('threads', torch.get_num_threads())"
    command = f"shell={sys.executable} -c \"{probe}\""
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    side_by_side = run(tmp_path, "--jobs", "2", "--command", command, env=env)
    assert "threads 1" in side_by_side.stdout, side_by_side.stdout + side_by_side.stderr
    told = run(tmp_path, "--jobs", "2", "--command", command, env={**env, "OMP_NUM_THREADS": "2"})
    assert "threads 2" in told.stdout, told.stdout + told.stderr


def summary_column(result: subprocess.CompletedProcess, unit: str) -> dict[str, float]:
    """Each passed group's figure in the summary's column of `unit`: "passed  12 s  2 cpu  0.1 GiB  name (log)"."""
    column = {"s": 1, "cpu": 3, "GiB": 5}[unit]
    return {line.split()[7]: float(line.split()[column]) for line in result.stdout.splitlines()
            if line.startswith("   passed")}


def test_a_group_s_peak_memory_counts_the_processes_it_started(tmp_path):
    # A child of the group's shell holds ~400 MiB for a few seconds; the shell itself holds almost nothing.
    hold = f"{sys.executable} -c \"import time; block = b'x' * (400 * 2**20); time.sleep(3)\""
    result = run(tmp_path, "--command", f"holder={hold} & wait", "--command", "idle=sleep 3")
    assert result.returncode == 0, result.stdout + result.stderr
    peaks = summary_column(result, "GiB")
    assert peaks["holder"] >= 0.35 and peaks["idle"] < 0.1, result.stdout


def test_a_group_s_cpu_time_counts_its_children_and_not_its_waiting(tmp_path):
    spin = f"{sys.executable} -c \"import time; end = time.process_time() + 1.5\nwhile time.process_time() < end: pass\""
    result = run(tmp_path, "--command", f"spinner={spin}", "--command", "sleeper=sleep 2")
    assert result.returncode == 0, result.stdout + result.stderr
    cpu = summary_column(result, "cpu")
    assert cpu["spinner"] >= 1 and cpu["sleeper"] < 0.5, result.stdout


def test_an_alone_group_runs_by_itself_on_every_thread(tmp_path):
    # Each records its start and end. "alone", listed second, starts first (a lane would idle behind it
    # otherwise), and the others only once it ended. "alone" keeps torch's own thread count; the others get one.
    def record(name: str) -> str:
        probe = "import torch; print('threads', torch.get_num_threads())"
        return (f"{name}=date +%s.%N > {tmp_path}/{name}.start; {sys.executable} -c \"{probe}\"; sleep 1; "
                f"date +%s.%N > {tmp_path}/{name}.end")
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    result = run(tmp_path, "--jobs", "2", "--command", record("first"), "--command", record("alone"),
                 "--command", record("last"), "--alone", "alone", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    times = {f.name: float(f.read_text()) for f in tmp_path.iterdir() if f.suffix in (".start", ".end")}
    assert times["alone.end"] <= min(times["first.start"], times["last.start"]), times
    alone_output = result.stdout.split("== alone")[1].split("==")[0]
    assert result.stdout.count("threads 1") == 2 and (f"threads {torch_threads()}" in alone_output), result.stdout


def test_groups_kept_apart_never_overlap_and_a_lighter_one_passes_the_waiting_one(tmp_path):
    # heavy-2 waits for heavy-1 to end although a lane is free; light, listed after it, takes that lane.
    def record(name: str, seconds: float) -> str:
        return (f"{name}=date +%s.%N > {tmp_path}/{name}.start; sleep {seconds}; "
                f"date +%s.%N > {tmp_path}/{name}.end")
    result = run(tmp_path, "--jobs", "2", "--command", record("heavy-1", 2), "--command", record("heavy-2", 0.2),
                 "--command", record("light", 0.2), "--apart", "heavy-1", "--apart", "heavy-2")
    assert result.returncode == 0, result.stdout + result.stderr
    times = {f.name: float(f.read_text()) for f in tmp_path.iterdir() if f.suffix in (".start", ".end")}
    assert times["heavy-1.end"] <= times["heavy-2.start"], times
    assert times["light.start"] < times["heavy-1.end"], times


def test_an_apart_or_alone_name_that_is_no_group_is_refused(tmp_path):
    result = run(tmp_path, "--command", "one=true", "--apart", "two")
    assert result.returncode == 2 and "--apart names groups that are not run: ['two']" in result.stderr


def torch_threads() -> int:
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                           capture_output=True, text=True, timeout=120)
    return int(probe.stdout)


def test_a_terminated_run_ends_what_its_groups_started(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    runner = subprocess.Popen([sys.executable, str(RUNNER), "--logs", str(tmp_path / "logs"), "--command",
                               f"sleeper=sleep 300 & echo $! > {pid_file}; wait"])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the group never started"
        time.sleep(0.1)
    sleeper = int(pid_file.read_text())
    runner.terminate()
    assert runner.wait(timeout=60) == 130
    deadline = time.monotonic() + 30
    while alive(sleeper):
        assert time.monotonic() < deadline, "the group's process outlived the run"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Running and not a zombie (Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
