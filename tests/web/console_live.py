"""A live `loraloom serve` for the console's browser tests: the command `make run` runs, on the
bundled model, with its own data directory, its training worker on the embedded broker, and the
built console at /console. Keys are made straight in its database, as `loraloom admin` does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from live_api import bearer, make_key, served_url

from loraloom.platform.db import upgrade_database
from loraloom.platform.settings import Settings

LORALOOM = Path(sys.executable).parent / "loraloom"
START_TIMEOUT_S = 300  # two shared, busy cores load torch and the model
# A checkpoint, and with a validation file an evaluation, every 10 steps: a short job reports
# validation loss while it runs, not only at its end.
CHECKPOINT_EVERY = 10


@dataclass
class Console:
    url: str
    keys: dict[str, str]  # "<tenant>-<role>" -> key
    log: Path
    database_url: str  # the server's own database, for tests that write usage rows as its meter would


def warm_up(url: str, key: str) -> None:
    """One generation before the browser tests: the first forward pass on a fresh server (the engine's
    warm-up, the worker loading beside it on the same cores) takes far longer than the ones after."""
    body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=START_TIMEOUT_S)
    assert response.status_code == 200, response.text


@contextmanager
def console_server(data_dir: Path, log: Path) -> Iterator[Console]:
    settings = Settings(data_dir=data_dir, record_flush_interval_ms=20, training_heartbeat_interval_s=0.5,
                        training_heartbeat_timeout_s=10.0, training_checkpoint_every=CHECKPOINT_EVERY)
    upgrade_database(settings.database_url)
    keys = {
        "default-admin": make_key(settings, tenant="default", role="admin"),
        "acme-admin": make_key(settings, tenant="acme", role="admin"),
        "acme-developer": make_key(settings, tenant="acme", role="developer"),
        "globex-admin": make_key(settings, tenant="globex", role="admin"),
        # A tenant of its own for tests that need to know every adapter or job listed (sorting, keyboard).
        "umbrella-developer": make_key(settings, tenant="umbrella", role="developer"),
        # The fine-tuning controls' and the canary's tests: jobs and adapters no other test counts.
        "initech-developer": make_key(settings, tenant="initech", role="developer"),
    }
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env.update(LORALOOM_DATA_DIR=str(data_dir), LORALOOM_RECORD_FLUSH_INTERVAL_MS="20",
               LORALOOM_TRAINING_HEARTBEAT_INTERVAL_S="0.5", LORALOOM_TRAINING_HEARTBEAT_TIMEOUT_S="10",
               LORALOOM_TRAINING_CHECKPOINT_EVERY=str(CHECKPOINT_EVERY))
    process = subprocess.Popen(
        [str(LORALOOM), "serve", "--port", "0", "--num-kv-blocks", "128"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        url = served_url(process, log, START_TIMEOUT_S)
        warm_up(url, keys["acme-developer"])
        yield Console(url=url, keys=keys, log=log, database_url=settings.database_url)
    finally:
        # The server and its worker (and the worker's job children) share this process group.
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        for group in [process.pid]:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=60)
