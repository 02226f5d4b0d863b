"""The documented command itself: `loraloom ray run --config deploy/ray/serve_config.cpu.yaml`, run as a
subprocess with a PostgreSQL database and nothing but LORALOOM_* variables, starts its local Ray cluster
and serves. Four adapters pushed through the gateway are each served by one replica (the metrics count
one host-cache copy per adapter). One engine replica's process is killed; Ray Serve's replacement counts
in the engine status while still idle, and under load for the survivor's adapters it takes its share
(the router spills to it) within 30 s. Ctrl-C then stops the command and every process of its cluster.

Bounded throughout (every wait has a deadline), and the fixture kills whatever of the cluster is left,
by session, even when a test fails."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings
from lora_factory import make_peft_adapter
from postgres_databases import throwaway_postgres_database
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray")
from ray._private.authentication_test_utils import reset_auth_token_state, set_auth_mode  # noqa: E402

from loraloom.engine import ADAPTER_FILES  # noqa: E402
from loraloom.platform.ray_serve.replica_board import replica_board  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CPU_CONFIG = Path("deploy/ray/serve_config.cpu.yaml")  # as the README writes it, run from the repository
LORALOOM = Path(sys.executable).parent / "loraloom"
ADAPTERS = [f"bot{index}" for index in range(4)]
TENANT = "acme"
KV_BLOCKS_PER_REPLICA = 128  # the CPU config's engine.num_kv_blocks
STARTUP_S = 300  # a cold start on a loaded two-core machine: Ray, two model loads, the gateway
REPLACEMENT_S = 240  # Ray Serve notices the dead replica and starts another (a model load)
SHARE_S = 30  # the brief's bound: from the replacement being up to it serving an existing adapter
STOP_S = 10  # Ctrl-C to the command's exit, its cluster stopped


@dataclass
class Running:
    process: subprocess.Popen
    log: Path
    url: str
    headers: dict[str, str]
    operator: dict[str, str]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def session_processes(session: int) -> list[int]:
    """The processes of the command's session: itself and every process of the Ray cluster it started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return found


def live_session_processes(session: int) -> list[int]:
    """Those not yet reaped zombies (a zombie holds no resources and goes with its parent)."""
    alive = []
    for pid in session_processes(session):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def wait_for(condition, what: str, timeout_s: float, log: Path | None = None, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log else ""
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{tail}")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def running(tmp_path_factory, postgres_admin_url) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("ray-run")
    with throwaway_postgres_database(postgres_admin_url) as database_url:
        settings = migrated_settings(directory / "data", database_url)
        key = make_key(settings, tenant=TENANT, role="developer")
        operator = make_key(settings, tenant="default", role="admin")
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("LORALOOM_", "RAY_"))}  # only what the README's command line names
        env.update({"LORALOOM_DATABASE_URL": database_url, "LORALOOM_DATA_DIR": str(settings.data_dir)})
        port = _free_port()
        log = directory / "ray-run.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [str(LORALOOM), "ray", "run", "--config", str(CPU_CONFIG), "--port", str(port)],
                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )
        saved_mode = os.environ.get("RAY_AUTH_MODE")
        try:
            def serving() -> bool:
                assert process.poll() is None, f"the command exited ({process.returncode}):\n{log.read_text()}"
                return "loraloom ray: serving at" in log.read_text(errors="replace")

            wait_for(serving, "the command to serve", STARTUP_S, log, poll_s=1.0)
            address = re.search(r"Ray cluster at (\S+)", log.read_text()).group(1)
            # The cluster the command started wants the token Ray saved for this user (~/.ray/auth_token),
            # which this process sends only in token mode; Ray reads the mode once, so it is reloaded.
            set_auth_mode("token")
            reset_auth_token_state()
            ray.init(address=address, namespace="loraloom-test", log_to_driver=False)
            yield Running(process, log, f"http://127.0.0.1:{port}", bearer(key), bearer(operator))
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if saved_mode is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                set_auth_mode(saved_mode)
            reset_auth_token_state()
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    pass
            for pid in session_processes(process.pid):  # anything the stop left behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.wait(10)


def chat(client: httpx.Client, headers: dict[str, str], model: str, max_tokens: int = 6) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens,
            "temperature": 0}
    response = client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def metric(client: httpx.Client, headers: dict[str, str], name: str) -> float:
    families = text_string_to_metric_families(client.get("/metrics", headers=headers).text)
    return sum(sample.value for family in families for sample in family.samples if sample.name == name)


def replica_labels(client: httpx.Client, headers: dict[str, str], name: str) -> set[str]:
    """The `replica` label values of a metric's samples in the gateway's /metrics."""
    families = text_string_to_metric_families(client.get("/metrics", headers=headers).text)
    return {sample.labels.get("replica", "") for family in families for sample in family.samples
            if sample.name == name}


def posts() -> list:
    return ray.get(replica_board().live_posts.remote(), timeout=30)


def served_by(post) -> dict[str, int]:
    """The tenant's adapters this replica has served, by name, with their request counts."""
    return {adapter.split("@")[0]: count for (tenant, adapter), count in post.stats.requests_per_adapter_total.items()
            if tenant == TENANT}


def test_the_command_serves_with_affinity_and_a_replacement_takes_its_share(running, model_dir, tmp_path):
    with httpx.Client(base_url=running.url, timeout=120) as client:
        for seed, name in enumerate(ADAPTERS):
            directory = make_peft_adapter(model_dir, tmp_path / name, rank=4, alpha=8,
                                          target_modules=["q_proj", "v_proj"], seed=seed)
            files = [("files", (file, (directory / file).read_bytes())) for file in ADAPTER_FILES]
            pushed = client.post(f"/v1/adapters/{name}/versions", files=files, headers=running.headers)
            assert pushed.status_code == 201, pushed.text
        for _ in range(2):  # the second round finds each adapter where the first left it
            for name in ADAPTERS:
                chat(client, running.headers, name)

        # Affinity, in the gateway's metrics (the replicas added up): each adapter has one host-cache copy.
        assert metric(client, running.operator, "loraloom_host_cache_adapters") == len(ADAPTERS)
        assert metric(client, running.operator, "loraloom_kv_blocks_total") == 2 * KV_BLOCKS_PER_REPLICA
        before = posts()
        assert len(before) == 2
        # Each replica its own series, labelled with the id it posts to the board under.
        assert replica_labels(client, running.operator, "loraloom_kv_blocks_total") == {post.replica for post in before}
        holder = max(before, key=lambda post: len(served_by(post)))
        survivor = next(post for post in before if post.replica != holder.replica)
        kept = sorted(served_by(survivor))  # the survivor's adapters: the replacement must take some of them
        if not kept:  # every adapter went to one replica: kill the idle one, the holder's adapters are kept
            holder, survivor = survivor, holder
            kept = sorted(served_by(survivor))
        assert kept

        # Kill the process of one engine replica, as an operator (or the OOM killer) would.
        victim = ray.get(replica_board().actor_of.remote(holder.replica))
        pid = ray.get(victim.__ray_call__.remote(lambda replica: os.getpid()))
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def replaced():
            current = posts()
            fresh = [post for post in current if post.replica not in {holder.replica, survivor.replica}]
            return fresh[0] if fresh and len(current) == 2 else None

        replacement = wait_for(replaced, "the replacement replica on the board", REPLACEMENT_S, running.log)
        up_at = time.monotonic()
        # Idle still, it already counts in the engine's capacity.
        status = client.get("/v1/engine/status", headers=running.operator).json()
        assert status["server"]["kv_blocks_total"] == 2 * KV_BLOCKS_PER_REPLICA, status

        # Load on the survivor's adapters only: the replacement holds none of them, so it gets them by
        # spillover alone (Ray Serve's own router kept them on the survivor).
        def replacement_serves_a_kept_adapter() -> bool:
            now = {post.replica: post for post in posts()}
            return replacement.replica in now and bool(set(served_by(now[replacement.replica])) & set(kept))

        with ThreadPoolExecutor(max_workers=6) as pool:
            deadline = up_at + SHARE_S
            while not replacement_serves_a_kept_adapter():
                assert time.monotonic() < deadline, f"the replacement served none of {kept} within {SHARE_S} s"
                answers = pool.map(lambda index: chat(client, running.headers, kept[index % len(kept)], 16), range(6))
                assert all(isinstance(answer, str) for answer in answers)
        served_at = time.monotonic()
        print(f"\nrebalance: replacement up {up_at - killed_at:.1f} s after the kill; "
              f"serving an existing adapter {served_at - up_at:.1f} s later ({served_at - killed_at:.1f} s in all)")


def test_ctrl_c_stops_the_command_and_its_cluster(running):
    ray.shutdown()  # this test's own connection first: the cluster is going away
    running.process.send_signal(signal.SIGINT)
    wait_for(lambda: running.process.poll() is not None, "the command to exit on Ctrl-C", STOP_S, running.log)
    assert running.process.returncode == 0, running.log.read_text()
    wait_for(lambda: not live_session_processes(running.process.pid), "the cluster's processes to end", STOP_S)
    assert "Ray shut down" in running.log.read_text()
