"""Issue 12, item 8: the worker `loraloom serve` started was not supervised. After kill -9 it stayed
a zombie, its job stayed `running` (its reaper died with it) and /health said ok; after kill -9 of an
idle pool child the worker took the next job and never ran it; after SIGTERM to serve the worker
lived on as an orphan. Here processes are really killed (or stopped), and the end state is awaited
with a generous deadline: serve restarts its worker, reaps its lost job (which resumes), detects a
stuck pool, reports the worker's state on /health, and takes its whole worker process group along when it
is stopped (SIGTERM) or killed (SIGKILL)."""
from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from product_codes import product_dataset
from serve_process import ServeProcess, children, cmdline, group_members, running, serve_process
from training_live import training_settings, upload, wait_finished, wait_for

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import FineTuningJob, FineTuningJobStatus, Tenant, utcnow
from loraloom.platform.training.hyperparameters import Hyperparameters

# On the tiny base: 15 steps an epoch (30 examples in batches of 2), a checkpoint every 5.
SHORT_JOB = Hyperparameters(n_epochs=1, batch_size=2, learning_rate=1e-3, lora_r=4, lora_alpha=8, max_seq_len=64,
                            target_modules=["q_proj", "v_proj"])
LONG_JOB = SHORT_JOB.model_copy(update={"n_epochs": 12})
CHECKPOINT_EVERY = 5
DISPATCH_TIMEOUT_S = 15.0  # a queued job not claimed this long by an idle worker: the worker is stuck
TIMEOUT_S = 300  # an upper bound for 2 shared, busy cores


def settings_for(data_dir: Path):
    return training_settings(data_dir, training_checkpoint_every=CHECKPOINT_EVERY,
                             training_dispatch_timeout_s=DISPATCH_TIMEOUT_S)


@pytest.fixture(scope="module")
def serve(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    directory = tmp_path_factory.mktemp("supervised")
    with serve_process(settings_for(directory / "data"), tiny_base, directory / "serve.log") as live:
        yield live


@pytest.fixture(scope="module")
def training_file(serve: ServeProcess) -> str:
    with serve.http() as client:
        return upload(client, product_dataset())["id"]


def create_job(serve: ServeProcess, training_file: str, hyperparameters: Hyperparameters, suffix: str) -> str:
    with serve.http() as client:
        response = client.post("/v1/fine_tuning/jobs", json={
            "model": "tiny-base", "training_file": training_file, "suffix": suffix, "seed": 1,
            "hyperparameters": hyperparameters.model_dump(),
        })
    assert response.status_code == 200, response.text
    return response.json()["id"]


def finished(serve: ServeProcess, job_id: str) -> dict:
    with serve.http() as client:
        return wait_finished(client, job_id, TIMEOUT_S, serve.log)


def gone(pids: list[int]) -> bool:
    return not any(running(pid) for pid in pids)


def test_a_killed_worker_is_restarted_and_health_reports_it(serve: ServeProcess, training_file: str) -> None:
    old, found = serve.wait_worker_group()
    assert serve.training_health() == {"worker": "up", "restarts": 0}
    # The worker's children change as it runs (Celery forks a new pool child for every job, and CI once saw a
    # child found at start-up gone a moment later, another in its place), so the group is read again here and
    # the processes found before are checked only while they live: each of them must be in the group.
    old_group = group_members(old)
    assert {pid for pid in found if running(pid)} <= set(old_group)

    os.kill(old, signal.SIGKILL)
    new = wait_for(lambda: (pid := serve.worker_pid()) != old and serve.training_health()["worker"] == "up" and pid,
                   "a new worker", TIMEOUT_S, serve.log)
    assert new != old and serve.training_health()["restarts"] == 1
    wait_for(lambda: gone(old_group), "the killed worker's processes to be gone (no zombie)", TIMEOUT_S, serve.log)

    job = finished(serve, create_job(serve, training_file, SHORT_JOB, "after-restart"))
    assert job["status"] == "succeeded", job


def pool_child(serve: ServeProcess) -> int:
    worker = serve.wait_worker_up()
    pool = wait_for(lambda: [pid for pid in children(worker) if cmdline(pid) == cmdline(worker)],
                    "the worker's pool child", TIMEOUT_S, serve.log)
    return pool[0]


def test_a_stuck_pool_is_detected_and_the_queued_job_runs(serve: ServeProcess, training_file: str) -> None:
    restarts = serve.training_health()["restarts"]
    os.kill(pool_child(serve), signal.SIGSTOP)  # idle and stopped: the worker hands it the job, which never runs

    job = finished(serve, create_job(serve, training_file, SHORT_JOB, "after-stuck-pool"))
    assert job["status"] == "succeeded", job
    assert serve.training_health()["restarts"] == restarts + 1


def test_a_job_queued_after_an_idle_pool_child_was_killed_runs(serve: ServeProcess, training_file: str) -> None:
    # Celery may replace the child before the job arrives, or hand the job to the dead one (then
    # serve restarts the worker): either way the job must run.
    os.kill(pool_child(serve), signal.SIGKILL)
    job = finished(serve, create_job(serve, training_file, SHORT_JOB, "after-killed-pool"))
    assert job["status"] == "succeeded", job


def test_a_running_job_whose_worker_was_killed_is_reaped_by_serve_and_resumed(
    serve: ServeProcess, training_file: str
) -> None:
    job_id = create_job(serve, training_file, LONG_JOB, "resumed")
    with serve.http() as client:
        wait_for(lambda: client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"],
                 "the job's first checkpoint", TIMEOUT_S, serve.log, poll_s=0.05)
    worker = serve.worker_pid()
    assert worker is not None
    os.killpg(worker, signal.SIGKILL)  # the whole worker, its reaper included: only serve's reaper is left

    job = finished(serve, job_id)
    assert (job["status"], job["attempts"]) == ("succeeded", 2), job
    with serve.http() as client:
        steps = [c["step_number"] for c in client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints",
                                                      params={"limit": 100}).json()["data"]]
    assert sorted(steps) == list(range(CHECKPOINT_EVERY, 12 * 15 + 1, CHECKPOINT_EVERY))


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopping_serve_stops_its_whole_worker(tiny_base: Path, tmp_path: Path, stop_signal: int) -> None:
    with serve_process(settings_for(tmp_path / "data"), tiny_base, tmp_path / "serve.log") as live:
        worker, _ = live.wait_worker_group()
        group = group_members(worker)  # as it is now, with any child that replaced one found before
        live.process.send_signal(stop_signal)
        live.process.wait(timeout=TIMEOUT_S)
        wait_for(lambda: gone(group), f"every process of the worker to end after {signal.Signals(stop_signal).name} "
                 "to serve", TIMEOUT_S, live.log)


def test_serve_without_a_worker_still_reaps_the_jobs_of_dead_workers(tiny_base: Path, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "data")
    engine = create_db_engine(settings.database_url)
    factory = create_session_factory(engine)
    with factory() as session:  # a job whose worker (on another machine) died an hour ago
        tenant = Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
        session.add(tenant)
        session.flush()
        job = FineTuningJob(
            id=f"ftjob-{uuid.uuid4().hex[:24]}", tenant_id=tenant.id, model="tiny-base", training_file="file-x",
            suffix="bot", seed=1, hyperparameters={}, status=FineTuningJobStatus.running, attempts=1, max_attempts=3,
            run_token="lost-run", worker_id="gone:1", heartbeat_at=utcnow() - timedelta(hours=1),
        )
        session.add(job)
        session.commit()
        job_id = job.id

    def status() -> FineTuningJobStatus:
        with factory() as session:
            return session.get(FineTuningJob, job_id).status

    try:
        with serve_process(settings, tiny_base, tmp_path / "serve.log", worker=False) as live:
            assert live.training_health() == {"worker": "external", "restarts": 0}
            wait_for(lambda: status() is FineTuningJobStatus.queued, "serve's reaper to requeue the job", TIMEOUT_S,
                     live.log)
    finally:
        engine.dispose()
