"""Engine replicas on Ray Serve (platform/ray_serve): a local Ray cluster started here with two CPU
engine replicas of the bundled model and one gateway, on PostgreSQL and a file:// blob store. Four
adapters are pushed through the gateway and called; each replica's own account (the status it posts
to the board) shows every adapter's requests served by one replica while both replicas served some,
and the greedy answers equal those of the single-process server over the same registry."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient
from live_api import bearer, make_key, migrated_settings
from postgres_databases import throwaway_postgres_database
from lora_factory import make_peft_adapter
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402  (after the skip: Ray is the optional extra `ray`)

from loraloom.engine import ADAPTER_FILES, AsyncEngine, EngineConfig  # noqa: E402
from loraloom.platform.api.composition import compose_app  # noqa: E402
from loraloom.platform.ray_serve.app import build_application  # noqa: E402
from loraloom.platform.ray_serve.engine_deployment import EngineDeployment  # noqa: E402
from loraloom.platform.ray_serve.replica_board import replica_board  # noqa: E402
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings  # noqa: E402
from loraloom.platform.storage import storage_from_settings  # noqa: E402

ENGINE = {"num_kv_blocks": 64, "max_loras": 4, "max_num_seqs": 8}
ADAPTERS = [f"bot{index}" for index in range(4)]
REQUESTS_PER_ADAPTER = 3
PROMPTS = ["Name a colour.", "Say hello.", "Count to three."]
TENANT = "acme"


@dataclass
class Cluster:
    url: str
    headers: dict[str, str]
    settings: object
    operator: dict[str, str]  # the gateway's /metrics is the operator's


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, postgres_admin_url) -> Iterator[Cluster]:
    with throwaway_postgres_database(postgres_admin_url) as database_url:
        settings = migrated_settings(tmp_path_factory.mktemp("ray-data"), database_url)
        key = make_key(settings, tenant=TENANT, role="developer")
        operator = make_key(settings, tenant="default", role="admin")
        # Every Ray process of this local cluster inherits these: the replicas' and the gateway's settings.
        environment = {"LORALOOM_DATA_DIR": str(settings.data_dir), "LORALOOM_DATABASE_URL": database_url,
                       "LORALOOM_RECORD_FLUSH_INTERVAL_MS": "20"}
        saved = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        ray.init(num_cpus=4, include_dashboard=False, namespace="loraloom-test", log_to_driver=False)
        try:
            port = _free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            engine = EngineDeployment.options(num_replicas=2, ray_actor_options={"num_cpus": 1})
            serve.run(build_application({"engine": ENGINE}, engine=engine), name="loraloom", route_prefix="/")
            yield Cluster(f"http://127.0.0.1:{port}", bearer(key), settings, bearer(operator))
        finally:
            serve.shutdown()
            ray.shutdown()
            for name, value in saved.items():
                os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def chat_body(model: str, prompt: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0}


def answers(post, headers: dict[str, str]) -> dict[tuple[str, str], str]:
    found = {}
    for name in ADAPTERS:
        for prompt in PROMPTS[:REQUESTS_PER_ADAPTER]:
            response = post("/v1/chat/completions", json=chat_body(name, prompt), headers=headers)
            assert response.status_code == 200, response.text
            found[(name, prompt)] = response.json()["choices"][0]["message"]["content"]
    # A structured-output request of the base model: its grammar is compiled by whichever engine serves it.
    json_body = {**chat_body("base", PROMPTS[0]), "max_tokens": 12, "response_format": {"type": "json_object"}}
    response = post("/v1/chat/completions", json=json_body, headers=headers)
    assert response.status_code == 200, response.text
    found[("base", "json")] = response.json()["choices"][0]["message"]["content"]
    return found


def test_each_adapter_is_served_by_one_replica_and_both_replicas_serve(cluster, model_dir, tmp_path):
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        for seed, name in enumerate(ADAPTERS):
            directory = make_peft_adapter(model_dir, tmp_path / name, rank=4, alpha=8,
                                          target_modules=["q_proj", "v_proj"], seed=seed)
            files = [("files", (file, (directory / file).read_bytes())) for file in ADAPTER_FILES]
            pushed = client.post(f"/v1/adapters/{name}/versions", files=files, headers=cluster.headers)
            assert pushed.status_code == 201, pushed.text
        served = answers(client.post, cluster.headers)
        status = client.get("/v1/engine/status", headers=cluster.headers)
        assert status.status_code == 200, status.text
        assert {resident["adapter"] for resident in status.json()["adapters"]} == set(ADAPTERS)

    posts = ray.get(replica_board().live_posts.remote())
    assert len(posts) == 2
    served_by: dict[str, list[tuple[str, int]]] = {name: [] for name in ADAPTERS}
    for post in posts:
        for (tenant, adapter), count in post.stats.requests_per_adapter_total.items():
            name = adapter.split("@")[0]
            if tenant == TENANT and name in served_by:
                served_by[name].append((post.replica, count))
    for name, replicas in served_by.items():
        assert [count for _, count in replicas] == [REQUESTS_PER_ADAPTER], f"{name}: {replicas}"
    assert {replica for replicas in served_by.values() for replica, _ in replicas} == {post.replica for post in posts}
    # The gateway's /metrics adds the replicas up.
    requests_total = {
        sample.labels["adapter"].split("@")[0]: sample.value
        for family in text_string_to_metric_families(httpx.get(f"{cluster.url}/metrics", headers=cluster.operator, timeout=60).text)
        for sample in family.samples
        if sample.name == "loraloom_adapter_requests_total" and sample.labels.get("tenant") == TENANT
        and sample.labels["adapter"] != "base"
    }
    assert requests_total == {name: REQUESTS_PER_ADAPTER for name in ADAPTERS}

    # The single-process server over the same registry answers the same, token for token.
    settings = cluster.settings
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(**ENGINE), adapter_fetcher_from_settings(settings, store))
    with TestClient(compose_app(settings, engine)) as local:
        assert answers(local.post, cluster.headers) == served


def engine_replicas_running() -> int:
    deployment = serve.status().applications["loraloom"].deployments["LoraloomEngine"]
    return deployment.replica_states.get("RUNNING", 0)


def registry_is_whole(client: httpx.Client, headers: dict[str, str]) -> None:
    """Every adapter is listed at version 1, and each of its files downloads with the sha256 registered."""
    import hashlib

    listed = client.get("/v1/adapters", params={"limit": 100}, headers=headers).json()["data"]
    assert sorted((item["name"], item["latest_version"]["version"]) for item in listed) == [(n, 1) for n in ADAPTERS]
    for name in ADAPTERS:
        download = client.get(f"/v1/adapters/{name}/versions/1/download", headers=headers)
        assert download.status_code == 200, download.text
        for file in download.json()["files"]:
            body = client.get(file["url"], headers=headers)
            assert body.status_code == 200, body.text
            assert hashlib.sha256(body.content).hexdigest() == file["sha256"], (name, file["filename"])


def test_a_replica_killed_during_traffic_gives_clean_503s_and_is_replaced(cluster):
    """Runs after the test above, on its adapters: the replica holding bot0 is killed while it serves
    bot0's requests. Each request completes or gets a 503 with Retry-After, none hangs; nothing the
    registry holds is lost or half-written; Ray Serve starts a replacement, and bot0 is served again
    with the same answer."""
    from concurrent.futures import ThreadPoolExecutor

    from live_api import wait_until

    board = replica_board()
    body = {**chat_body("bot0", PROMPTS[0]), "max_tokens": 48}
    with httpx.Client(base_url=cluster.url, timeout=300) as client:
        # First, so that a replica holds bot0 even if Ray Serve replaced one since the test above (a
        # replica too slow for its health check on a loaded machine is restarted, with fresh stats).
        before = client.post("/v1/chat/completions", json=chat_body("bot0", PROMPTS[0]), headers=cluster.headers)
        assert before.status_code == 200, before.text

        def bot0_holders() -> list:
            return [post for post in ray.get(board.live_posts.remote())
                    if any(adapter.split("@")[0] == "bot0" for (_, adapter) in post.stats.requests_per_adapter_total)]

        wait_until(bot0_holders, "bot0's replica on the board (it posts as its requests end)")
        holder = bot0_holders()[0]
        victim = ray.get(board.actor_of.remote(holder.replica))
        with ThreadPoolExecutor(max_workers=4) as pool:
            calls = [pool.submit(client.post, "/v1/chat/completions", json=body, headers=cluster.headers)
                     for _ in range(4)]

            def serving() -> bool:
                return any(post.replica == holder.replica and post.stats.num_running > 0
                           for post in ray.get(board.live_posts.remote()))

            wait_until(serving, "bot0's requests running on their replica", timeout_s=240)
            ray.kill(victim, no_restart=True)
            responses = [call.result() for call in calls]
        assert any(response.status_code == 503 for response in responses), [r.text for r in responses]
        for response in responses:
            if response.status_code == 503:
                error = response.json()["error"]
                assert error["code"] == "engine_unavailable" and error["type"] == "server_error", error
                assert int(response.headers["Retry-After"]) >= 1
            else:
                assert response.status_code == 200, response.text

        registry_is_whole(client, cluster.headers)
        wait_until(lambda: engine_replicas_running() == 2, "the replacement replica", timeout_s=240)
        again = client.post("/v1/chat/completions", json=chat_body("bot0", PROMPTS[0]), headers=cluster.headers)
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["message"]["content"] == before.json()["choices"][0]["message"]["content"]
    assert holder.replica not in {post.replica for post in ray.get(board.live_posts.remote())}
