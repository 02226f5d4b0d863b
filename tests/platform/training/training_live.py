"""A live server and real training workers for the fine-tuning tests.

The server runs in a thread (tests/live_api.py) with the bundled model; workers are real
`loraloom worker` processes (each in its own process group, so a test can SIGKILL one with
its job child), configured through the same LORALOOM_* environment a deployment uses.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from live_api import bearer, make_key, serve_in_thread

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.db import upgrade_database
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.worker import end_with_parent

MAX_LORA_RANK = 16
FINISHED = ("succeeded", "failed", "cancelled")
# Quick to notice a dead worker, slow enough that a live one on 2 busy cores is never taken for dead.
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 6.0
# Fields a worker needs the same as the server's; the rest keep their defaults on both sides.
WORKER_SETTINGS = ("data_dir", "database_url", "broker_url", "training_heartbeat_interval_s",
                   "training_heartbeat_timeout_s", "training_checkpoint_every", "training_max_attempts",
                   "training_dispatch_timeout_s")


def training_settings(data_dir: Path, **overrides: Any) -> Settings:
    settings = Settings(
        data_dir=data_dir, record_flush_interval_ms=20, training_heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        training_heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, **overrides,
    )
    upgrade_database(settings.database_url)
    return settings


def worker_environment(settings: Settings) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    for field in WORKER_SETTINGS:
        value = getattr(settings, field)
        if value is not None:
            env[f"LORALOOM_{field.upper()}"] = str(value)
    return env


@dataclass
class TrainingServer:
    url: str
    settings: Settings
    keys: dict[str, str]  # acme-developer, acme-inference, globex-developer
    model_name: str

    def http(self, key: str = "acme-developer") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.keys[key]), timeout=120)


@contextmanager
def training_server(model_dir: Path, settings: Settings) -> Iterator[TrainingServer]:
    keys = {
        "acme-developer": make_key(settings, tenant="acme", role="developer"),
        "acme-inference": make_key(settings, tenant="acme", role="inference"),
        "globex-developer": make_key(settings, tenant="globex", role="developer"),
    }
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(
        model_dir, EngineConfig(num_kv_blocks=128, max_num_seqs=32, max_lora_rank=MAX_LORA_RANK),
        adapter_fetcher_from_settings(settings, store),
    )
    with serve_in_thread(compose_app(settings, engine)) as url:
        yield TrainingServer(url=url, settings=settings, keys=keys, model_name=engine.model_name)


@contextmanager
def worker_process(settings: Settings, model_dir: Path, log_path: Path) -> Iterator[subprocess.Popen]:
    """A `loraloom worker` in its own process group; killed (with its job child) when the block ends."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "loraloom.platform.cli", "worker", "--model", str(model_dir)],
            env=worker_environment(settings), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=end_with_parent,  # no worker outlives a test run cut short
        )
    try:
        yield process
    finally:
        kill_worker(process)


def kill_worker(process: subprocess.Popen) -> None:
    """SIGKILL the worker and its job child: what a lost machine looks like to the rest."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def wait_for(check, what: str, timeout_s: float, log_path: Path | None = None, poll_s: float = 0.2):
    """Poll `check` until it returns something truthy; fail naming `what` (and the worker's log) on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            log = log_path.read_text()[-4000:] if log_path is not None and log_path.exists() else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{log}")
        time.sleep(poll_s)


def upload(client: httpx.Client, lines: list[dict], filename: str = "train.jsonl") -> dict:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    response = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (filename, data)})
    assert response.status_code == 200, response.text
    return response.json()


def job(client: httpx.Client, job_id: str) -> dict:
    response = client.get(f"/v1/fine_tuning/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def all_events(client: httpx.Client, job_id: str) -> list[dict]:
    """Every event, oldest first, through the paginated endpoint."""
    events: list[dict] = []
    params: dict[str, Any] = {"order": "asc", "limit": 100}
    while True:
        page = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params=params).json()
        events += page["data"]
        if not page["has_more"]:
            return events
        params["after"] = page["data"][-1]["id"]


def wait_finished(client: httpx.Client, job_id: str, timeout_s: float, log_path: Path | None = None) -> dict:
    return wait_for(lambda: (state := job(client, job_id))["status"] in FINISHED and state,
                    f"job {job_id} to finish", timeout_s, log_path)
