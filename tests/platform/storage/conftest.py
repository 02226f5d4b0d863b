"""A real S3-compatible server for the storage tests: moto's standalone server over HTTP."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loraloom.platform.storage.s3 import make_s3_client

REGION = "us-east-1"
BUCKET = "loraloom-test"
STARTUP_TIMEOUT_S = 30


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    region: str


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _moto_server_command() -> str:
    beside_python = Path(sys.executable).with_name("moto_server")
    found = str(beside_python) if beside_python.exists() else shutil.which("moto_server")
    if found is None:
        pytest.skip("moto_server not installed; pip install 'moto[server]'")
    return found


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    port = _free_loopback_port()
    process = subprocess.Popen(
        [_moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()
    log: list[str] = []

    def drain_log() -> None:
        # Werkzeug announces "Running on http://..." once it listens; keep reading after that
        # so the per-request log lines never fill the pipe and block the server.
        for line in process.stderr:
            log.append(line)
            if "Running on" in line:
                ready.set()
        ready.set()  # the server exited: stop waiting

    drainer = threading.Thread(target=drain_log, daemon=True)
    drainer.start()
    try:
        if not ready.wait(STARTUP_TIMEOUT_S) or process.poll() is not None:
            raise RuntimeError("moto_server did not start:\n" + "".join(log))
        with pytest.MonkeyPatch.context() as env:
            # boto3 reads credentials from the environment; moto accepts any.
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            server = S3Server(endpoint_url=f"http://127.0.0.1:{port}", bucket=BUCKET, region=REGION)
            make_s3_client(endpoint_url=server.endpoint_url, region=REGION).create_bucket(Bucket=BUCKET)
            yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        drainer.join()  # it stops at the end of the closed pipe
        process.stderr.close()
