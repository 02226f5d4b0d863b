"""`loraloom serve` started as a user starts it, and a client that sends a batch of chats at once."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from served.workload import ChatRequest

LORALOOM = Path(sys.executable).with_name("loraloom")


@dataclass
class Server:
    url: str
    key: str
    process: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(data_dir: Path, serve_args: list[str], log_path: Path) -> Iterator[Server]:
    """`loraloom serve` on a free port with its own data dir; a developer key made with `loraloom admin`."""
    env = {**os.environ, "LORALOOM_DATA_DIR": str(data_dir)}
    port = _free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen([str(LORALOOM), "serve", "--host", "127.0.0.1", "--port", str(port), "--no-worker",
                                    *serve_args], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"loraloom serve exited with {process.returncode}; see {log_path}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"loraloom serve did not answer /health; see {log_path}")
            time.sleep(0.5)
        yield Server(url, tenant_key(data_dir, "bench"), process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def tenant_key(data_dir: Path, tenant: str) -> str:
    """A developer key of `tenant` (created if new), made with `loraloom admin` on the server's data dir."""
    env = {**os.environ, "LORALOOM_DATA_DIR": str(data_dir)}
    return subprocess.run([str(LORALOOM), "admin", "create-key", "--tenant", tenant, "--role", "developer"],
                          env=env, check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class BatchResult:
    seconds: float
    completion_tokens: int
    texts: list[str]

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds


async def _send_all(server: Server, requests: list[ChatRequest], base_name: str, ignore_eos: bool) -> BatchResult:
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=len(requests) + 4)
    headers = {"Authorization": f"Bearer {server.key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=None) as client:
        async def one(request: ChatRequest) -> dict:
            body = {"model": request.adapter or base_name, "messages": request.message_dicts(),
                    "max_tokens": request.max_tokens, "temperature": 0, "ignore_eos": ignore_eos}
            response = await client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.text}")
            return response.json()

        start = time.perf_counter()
        answers = await asyncio.gather(*(one(request) for request in requests))
        seconds = time.perf_counter() - start
    return BatchResult(seconds, sum(a["usage"]["completion_tokens"] for a in answers),
                       [a["choices"][0]["message"]["content"] for a in answers])


def send_batch(server: Server, requests: list[ChatRequest], base_name: str = "base",
               ignore_eos: bool = False) -> BatchResult:
    """Send every request at once (concurrent connections); wall time from first send to last answer."""
    return asyncio.run(_send_all(server, requests, base_name, ignore_eos))
