"""`loraloom worker` on a real broker (the Redis service) writes only JSON lines, stdout and stderr
together as a log shipper collects them: no banner, Celery's own lines and warnings (its
SecurityWarning when run as root) as JSON, a task run in the forked job child logged as JSON, and
the shutdown notice Celery writes straight to stdout turned into a JSON line."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import redis
from training_live import training_settings, wait_for, worker_process

from loraloom.platform.training.celery_app import create_celery_app, send_run_job

REDIS_URL = os.environ.get("LORALOOM_TEST_REDIS_URL", "redis://127.0.0.1:6379/12")
START_TIMEOUT_S = 180  # two shared, busy cores


@pytest.fixture
def redis_broker() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as error:
        pytest.skip(f"Redis not reachable at {REDIS_URL} (set LORALOOM_TEST_REDIS_URL): {error}")
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


def test_a_worker_s_whole_output_is_json_lines(model_dir: Path, tmp_path: Path, redis_broker: str):
    settings = training_settings(tmp_path / "data", broker_url=redis_broker)
    log = tmp_path / "worker.log"
    with worker_process(settings, model_dir, log) as worker:
        wait_for(lambda: "ready." in log.read_text(), "the worker to be ready", START_TIMEOUT_S, log)
        # A message for a job that is not in the database: the job child runs the task, finds nothing to do.
        send_run_job(create_celery_app(settings), "ftjob-not-in-the-database")
        wait_for(lambda: "succeeded in" in log.read_text(), "the task's run", START_TIMEOUT_S, log)
        worker.send_signal(signal.SIGTERM)  # a warm shutdown, whose notice Celery writes to stdout
        worker.wait(timeout=60)

    lines = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {number} of the worker's output is not JSON: {line!r}") from None
    loggers = {line["logger"] for line in lines}
    assert {"celery.apps.worker", "celery.app.trace", "loraloom.platform.training.runner"} <= loggers, loggers
    assert any(line["logger"] == "celery.stdout" and "shutdown" in line["message"] for line in lines)
    assert not any("[queues]" in line["message"] or "[config]" in line["message"] for line in lines)  # no banner
