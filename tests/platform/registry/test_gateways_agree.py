"""Two gateways on one PostgreSQL database and one blob store, each an app of its own (its own
engine, resolution cache and change listener, as two `loraloom serve` processes would have): a
change made through gateway A (an alias promoted, a version deleted, a key revoked) holds on
gateway B's next request.

B learns of registry changes asynchronously, from PostgreSQL's notifications: the test waits for
B's count of applied notifications on /metrics (no timing is asserted), then checks what B's next
request serves. Resolutions are cached for an hour here, so only the notification can refresh B.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_api import TEST_FLUSH_INTERVAL_MS, bearer, make_key, wait_until
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import ADAPTER_FILES
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.db import upgrade_database
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings

HOUR_S = 3600.0
NOTIFICATION_WAIT_S = 10.0  # generous; delivery takes milliseconds
CHAT = [{"role": "user", "content": "Say something."}]


@dataclass
class Gateway:
    client: TestClient
    registry: RegistryService
    operator: dict[str, str]  # /metrics is the operator's

    def chat(self, headers: dict[str, str], model: str):
        return self.client.post("/v1/chat/completions", headers=headers,
                                json={"model": model, "messages": CHAT, "max_tokens": 2, "temperature": 0})

    def metric(self, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(self.client.get("/metrics", headers=self.operator).text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return 0.0

    def served(self, tenant: str, adapter: str) -> float:
        """Requests this gateway's engine served with that version (`name@N`)."""
        return self.metric("loraloom_adapter_requests_total", tenant=tenant, adapter=adapter)

    def notifications(self) -> float:
        return self.metric("loraloom_adapter_change_notifications_total")


def gateway_settings(root: Path, name: str, database_url: str) -> Settings:
    """A gateway's own data dir (engine cache, staging) over the shared database and blob store."""
    return Settings(
        data_dir=root / name, database_url=database_url, storage_url=(root / "blobs").as_uri(),
        record_flush_interval_ms=TEST_FLUSH_INTERVAL_MS, adapter_resolution_ttl_s=HOUR_S,
    )


@pytest.fixture
def gateways(postgres_database_url: str, model_dir: Path, tmp_path: Path) -> Iterator[tuple[Gateway, Gateway]]:
    upgrade_database(postgres_database_url)
    operator = bearer(make_key(gateway_settings(tmp_path, "a", postgres_database_url), tenant="default", role="admin"))
    with InProcessGateway(gateway_settings(tmp_path, "a", postgres_database_url), model_dir, operator) as a, \
            InProcessGateway(gateway_settings(tmp_path, "b", postgres_database_url), model_dir, operator) as b:
        yield a, b


class InProcessGateway:
    """An app as `loraloom serve` builds it (compose_app), served in-process."""

    def __init__(self, settings: Settings, model_dir: Path, operator: dict[str, str]) -> None:
        self.operator = operator
        store = storage_from_settings(settings)
        engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=16, max_loras=2),
                                    adapter_fetcher_from_settings(settings, store))
        app = compose_app(settings, engine)
        self.registry = app.state.registry
        self.client = TestClient(app)

    def __enter__(self) -> Gateway:
        self.client.__enter__()
        return Gateway(self.client, self.registry, self.operator)

    def __exit__(self, *exc_info: object) -> None:
        self.client.__exit__(*exc_info)


def push(gateway: Gateway, headers: dict[str, str], name: str, directory: Path) -> None:
    files = [("files", (file, (directory / file).read_bytes(), "application/octet-stream")) for file in ADAPTER_FILES]
    response = gateway.client.post(f"/v1/adapters/{name}/versions", files=files, headers=headers)
    assert response.status_code == 201, response.text


def test_a_change_through_one_gateway_holds_on_the_others_next_request(
    gateways, postgres_database_url, tmp_path, peft_adapter, other_peft_adapter
):
    a, b = gateways
    settings = gateway_settings(tmp_path, "a", postgres_database_url)
    developer = bearer(make_key(settings, tenant="acme", role="developer"))
    admin = bearer(make_key(settings, tenant="acme", role="admin"))
    changes = 0

    def b_heard_every_change() -> None:
        wait_until(lambda: b.notifications() >= changes, f"gateway B to hear change {changes}", NOTIFICATION_WAIT_S)
        assert b.notifications() == changes  # one notification per change, none twice

    wait_until(lambda: b.metric("loraloom_adapter_change_listening") == 1, "B's listener", NOTIFICATION_WAIT_S)
    push(a, developer, "bot", peft_adapter)
    push(a, developer, "bot", other_peft_adapter)
    assert a.client.put("/v1/adapters/bot/aliases/prod", json={"version": 1}, headers=developer).status_code == 200
    changes += 3
    b_heard_every_change()

    # B resolves bot:prod to version 1 and keeps that answer.
    assert b.chat(developer, "bot:prod").status_code == 200
    assert b.served("acme", "bot@1") == 1
    assert len(b.registry.resolutions) == 1

    # Promote prod to version 2 through A: B's next request serves version 2.
    assert a.client.put("/v1/adapters/bot/aliases/prod", json={"version": 2}, headers=developer).status_code == 200
    changes += 1
    b_heard_every_change()
    assert b.chat(developer, "bot:prod").status_code == 200
    assert (b.served("acme", "bot@1"), b.served("acme", "bot@2")) == (1, 1)

    # Delete version 1 through A, after B cached bot@1: B's next request for it is refused.
    assert b.chat(developer, "bot@1").status_code == 200
    assert b.served("acme", "bot@1") == 2
    assert a.client.delete("/v1/adapters/bot/versions/1", headers=developer).status_code == 200
    changes += 1
    b_heard_every_change()
    refused = b.chat(developer, "bot@1")
    assert refused.status_code == 404, refused.text
    assert b.served("acme", "bot@1") == 2

    # Revoke a key through A: B refuses it on its next request (keys are checked in the database
    # on every request, no notification needed).
    victim = make_key(settings, tenant="acme", role="inference", name="victim")
    assert b.chat(bearer(victim), "bot:prod").status_code == 200
    keys = a.client.get("/v1/keys", headers=admin).json()["data"]
    victim_id = next(key["id"] for key in keys if key["name"] == "victim")
    assert a.client.delete(f"/v1/keys/{victim_id}", headers=admin).status_code == 200
    revoked = b.chat(bearer(victim), "bot:prod")
    assert revoked.status_code == 401 and revoked.json()["error"]["code"] == "api_key_revoked", revoked.text


def test_a_split_set_through_one_gateway_picks_the_same_version_for_each_user_on_both(
    gateways, postgres_database_url, tmp_path, peft_adapter, other_peft_adapter
):
    a, b = gateways
    developer = bearer(make_key(gateway_settings(tmp_path, "a", postgres_database_url), tenant="acme", role="developer"))
    users = [f"user-{index}" for index in range(20)]

    def served(gateway: Gateway, user: str) -> str:
        response = gateway.client.post("/v1/completions", headers=developer, json={
            "model": "bot:prod", "prompt": "Hello", "max_tokens": 1, "user": user})
        assert response.status_code == 200, response.text
        return response.json()["model"]

    wait_until(lambda: b.metric("loraloom_adapter_change_listening") == 1, "B's listener", NOTIFICATION_WAIT_S)
    push(a, developer, "bot", peft_adapter)
    push(a, developer, "bot", other_peft_adapter)
    assert a.client.put("/v1/adapters/bot/aliases/prod", json={"version": 1}, headers=developer).status_code == 200
    wait_until(lambda: b.notifications() >= 3, "B to hear the pushes and the alias", NOTIFICATION_WAIT_S)
    assert {served(b, user) for user in users} == {"bot@1"}  # B caches prod at version 1

    split = {"split": [{"version": 1, "weight": 1}, {"version": 2, "weight": 1}]}
    assert a.client.put("/v1/adapters/bot/aliases/prod", json=split, headers=developer).status_code == 200
    wait_until(lambda: b.notifications() >= 4, "B to hear the split", NOTIFICATION_WAIT_S)
    on_a = {user: served(a, user) for user in users}
    assert set(on_a.values()) == {"bot@1", "bot@2"}  # 20 users at 50/50: all on one side once in 500,000 runs
    assert {user: served(b, user) for user in users} == on_a  # the same user, the same version, on either gateway

    assert a.client.post("/v1/adapters/bot/aliases/prod/promote", headers=developer).json()["version"] == 2
    wait_until(lambda: b.notifications() >= 5, "B to hear the promotion", NOTIFICATION_WAIT_S)
    assert {served(b, user) for user in users} == {"bot@2"}
