"""A live loraloom API for tests: a migrated database with tenants and keys made directly in
it, and uvicorn serving an app on a free port in a background thread."""
from __future__ import annotations

import queue
import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from loraloom.platform.cli.admin import admin_create_key
from loraloom.platform.db import upgrade_database
from loraloom.platform.db.models import ApiKeyRole
from loraloom.platform.settings import Settings

# Short, so tests see metered rows soon; batching is still exercised (see tests/platform/metering).
TEST_FLUSH_INTERVAL_MS = 20


def migrated_settings(data_dir: Path, database_url: str | None = None) -> Settings:
    """Settings on `database_url` (default: a SQLite file in `data_dir`), migrated to the latest revision."""
    settings = Settings(
        data_dir=data_dir, database_url=database_url, record_flush_interval_ms=TEST_FLUSH_INTERVAL_MS
    )
    upgrade_database(settings.database_url)
    return settings


def make_key(settings: Settings, *, tenant: str, role: str, name: str = "test") -> str:
    """A new API key, made in the database like `loraloom admin create-key` does (tenant created if new)."""
    return admin_create_key(settings, tenant=tenant, role=ApiKeyRole(role), name=name)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class _ServerWithReadyEvent(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Serve `app` on a free local port; yields its base URL. Leaving the block shuts it down
    (the app's lifespan ends: writers flushed, engine stopped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # the OS picks a free port; uvicorn serves on this very socket
    port = listener.getsockname()[1]
    server = _ServerWithReadyEvent(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        assert server.ready.wait(timeout=120) and server.started, "the server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        listener.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll for the server's asynchronous work (no timing is asserted, only that it happens)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def new_tenant(session):
    """A tenant with a name no other test uses, added to `session` and flushed (so it has its id)."""
    from loraloom.platform.db.models import Tenant

    tenant = Tenant(name=f"t-{uuid.uuid4().hex[:8]}")
    session.add(tenant)
    session.flush()
    return tenant


def tee_lines(stream, lines: "queue.Queue[str | None]", log: Path) -> None:
    """Copy a child process's output lines to `log` and to `lines` (None once it closes)."""
    with open(log, "a") as out:
        for line in stream:
            out.write(line)
            out.flush()
            lines.put(line)
    lines.put(None)


def served_url(process: "subprocess.Popen[str]", log: Path, timeout_s: float) -> str:
    """The URL of a `loraloom serve --port 0` child, read off the line where uvicorn names its port;
    its stderr keeps being copied to `log` (for the failure report) after that."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=tee_lines, args=(process.stderr, lines, log), daemon=True).start()
    while True:
        line = lines.get(timeout=timeout_s)
        assert line is not None, f"loraloom serve exited early:\n{log.read_text()}"
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return f"http://127.0.0.1:{match.group(1)}"
