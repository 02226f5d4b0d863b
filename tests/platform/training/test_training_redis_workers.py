"""Training workers on a real broker (the Redis service): a worker SIGKILLed mid-job (with its
job child) leaves the job to be requeued by another worker's reaper and finished, never stuck
`running` and never run twice at once; the same message delivered twice starts one run."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from product_codes import product_dataset
from training_live import (
    TrainingServer,
    all_events,
    kill_worker,
    training_server,
    training_settings,
    upload,
    wait_finished,
    wait_for,
    worker_process,
)

from loraloom.platform.training.celery_app import TRAINING_QUEUE, create_celery_app, send_run_job
from loraloom.platform.training.hyperparameters import Hyperparameters

# A database of its own, emptied before and after, so nothing else's messages mix in.
REDIS_URL = os.environ.get("LORALOOM_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
# A short job: 24 examples in batches of 8 = 3 steps, LoRA on two projections; long enough to be
# killed mid-run (after its first step), short enough for 2 CPU cores.
SHORT_JOB = Hyperparameters(n_epochs=1, batch_size=8, learning_rate=1e-3, lora_r=4, lora_alpha=8, max_seq_len=64,
                            target_modules=["q_proj", "v_proj"])
SHORT_JOB_EXAMPLES = 24
SHORT_JOB_STEPS = 3
JOB_TIMEOUT_S = 1200  # an upper bound for 2 shared, busy cores; a few minutes on idle ones


@pytest.fixture(scope="module")
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as error:
        pytest.skip(f"Redis not reachable at {REDIS_URL} (set LORALOOM_TEST_REDIS_URL): {error}")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, redis_client: redis.Redis
           ) -> Iterator[TrainingServer]:
    settings = training_settings(tmp_path_factory.mktemp("redis-training"), broker_url=REDIS_URL,
                                 training_max_attempts=2, training_checkpoint_every=2)
    with training_server(model_dir, settings) as live:
        yield live


def create_job(server: TrainingServer, suffix: str) -> str:
    with server.http() as client:
        file_id = upload(client, product_dataset()[:SHORT_JOB_EXAMPLES])["id"]
        response = client.post("/v1/fine_tuning/jobs", json={
            "model": server.model_name, "training_file": file_id, "suffix": suffix, "seed": 1,
            "hyperparameters": SHORT_JOB.model_dump(),
        })
    assert response.status_code == 200, response.text
    return response.json()["id"]


def broker_drained(client: redis.Redis) -> bool:
    """No message waiting in the training queue and none delivered but unacknowledged."""
    waiting = sum(client.llen(key) for key in client.keys(f"{TRAINING_QUEUE}*") if client.type(key) == b"list")
    return waiting == 0 and client.hlen("unacked") == 0


def test_a_killed_worker_s_job_is_requeued_and_finished_by_another(
    server: TrainingServer, model_dir: Path, tmp_path: Path
) -> None:
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    with server.http() as client:
        with worker_process(server.settings, model_dir, logs[0]) as doomed:
            job_id = create_job(server, "survivor")
            wait_for(lambda: any(e["type"] == "metrics" for e in all_events(client, job_id)),
                     "the first step", JOB_TIMEOUT_S, logs[0])
            kill_worker(doomed)
        assert client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] == "running"  # until someone reaps

        with worker_process(server.settings, model_dir, logs[1]):
            final = wait_finished(client, job_id, JOB_TIMEOUT_S, logs[1])
        assert final["status"] == "succeeded", final
        assert final["attempts"] == 2 and final["fine_tuned_model"] == "survivor@1"

        events = all_events(client, job_id)
        started = [i for i, e in enumerate(events) if e["message"].startswith("Fine-tuning job started")]
        assert [events[i]["data"]["attempt"] for i in started] == [1, 2]
        lost = [e for e in events if "stopped responding" in e["message"]]
        assert len(lost) == 1 and lost[0]["level"] == "warn" and "requeued" in lost[0]["message"]
        # Never two runs at once: every event of run 1 comes before run 2 started.
        metrics = [(i, e["data"]["attempt"]) for i, e in enumerate(events) if e["type"] == "metrics"]
        assert metrics and all((attempt == 1) == (i < started[1]) for i, attempt in metrics)
        assert [step["data"]["step"] for step in events[started[1]:] if step["type"] == "metrics"] == list(
            range(1, SHORT_JOB_STEPS + 1))
        versions = client.get("/v1/adapters/survivor/versions").json()["data"]
        assert [v["version"] for v in versions] == [1]


def test_the_same_message_delivered_twice_starts_one_run(
    server: TrainingServer, model_dir: Path, tmp_path: Path, redis_client: redis.Redis
) -> None:
    redis_client.flushdb()  # a killed worker's unacknowledged message (visible only after hours) is not this test's
    job_id = create_job(server, "once")  # its message waits in Redis: no worker is running
    send_run_job(create_celery_app(server.settings), job_id)  # the duplicate, as a redelivery would be
    logs = [tmp_path / "worker-c.log", tmp_path / "worker-d.log"]
    with server.http() as client, worker_process(server.settings, model_dir, logs[0]), \
            worker_process(server.settings, model_dir, logs[1]):
        final = wait_finished(client, job_id, JOB_TIMEOUT_S, logs[0])
        wait_for(lambda: broker_drained(redis_client), "both messages to be consumed", JOB_TIMEOUT_S, logs[1])
        wait_for(lambda: any("nothing to do" in log.read_text() for log in logs),
                 "the duplicate to be refused", JOB_TIMEOUT_S, logs[1])
        assert final["status"] == "succeeded" and final["attempts"] == 1, final
        started = [e for e in all_events(client, job_id) if e["message"].startswith("Fine-tuning job started")]
        assert len(started) == 1
        assert [v["version"] for v in client.get("/v1/adapters/once/versions").json()["data"]] == [1]
