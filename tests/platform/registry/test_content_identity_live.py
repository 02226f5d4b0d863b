"""Through a live app (registry on SQLite, file:// blobs, the bundled model): two references to
the same bytes in one tenant occupy one GPU slot and one host-cache entry, another tenant's copy
of those bytes does not share them; a push of the same files answers 200 with the version; usage
and the per-adapter metrics speak names (adapter, version, alias) per tenant, never runtime keys."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_api import bearer, make_key, migrated_settings, wait_until
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import ADAPTER_FILES
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

CHAT = [{"role": "user", "content": "Say something."}]


@dataclass
class Live:
    client: TestClient
    engine: AsyncEngine
    acme: dict[str, str]  # developer keys' headers
    globex: dict[str, str]
    operator: dict[str, str]  # /metrics is the operator's

    def push(self, headers: dict[str, str], name: str, directory: Path):
        files = [("files", (file, (directory / file).read_bytes(), "application/octet-stream")) for file in ADAPTER_FILES]
        return self.client.post(f"/v1/adapters/{name}/versions", files=files, headers=headers)

    def chat(self, headers: dict[str, str], model: str) -> str:
        response = self.client.post("/v1/chat/completions", headers=headers,
                                    json={"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    def resident_keys(self) -> list[str]:
        return self.engine.engine.slot_table.resident_keys()


@pytest.fixture(scope="module")
def live(model_dir, tmp_path_factory) -> Iterator[Live]:
    settings = migrated_settings(tmp_path_factory.mktemp("server"))
    acme = make_key(settings, tenant="acme", role="developer")
    globex = make_key(settings, tenant="globex", role="developer")
    operator = make_key(settings, tenant="default", role="admin")
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64, max_loras=8),
                                adapter_fetcher_from_settings(settings, store))
    with TestClient(compose_app(settings, engine)) as client:
        yield Live(client, engine, bearer(acme), bearer(globex), bearer(operator))


def test_push_of_the_same_files_answers_200_with_the_existing_version(live, peft_adapter, other_peft_adapter):
    assert live.push(live.acme, "bot", peft_adapter).status_code == 201
    assert live.push(live.acme, "bot", other_peft_adapter).status_code == 201
    again = live.push(live.acme, "bot", peft_adapter)
    assert again.status_code == 200 and (again.json()["version"], again.json()["deduplicated"]) == (1, True)
    versions = live.client.get("/v1/adapters/bot/versions", headers=live.acme).json()["data"]
    assert [v["version"] for v in versions] == [1, 2]
    assert live.client.get("/v1/adapters/bot", headers=live.acme).json()["aliases"]["latest"] == 2


def test_two_references_to_the_same_bytes_share_one_slot_but_not_across_tenants(live, peft_adapter):
    for name in ("cow", "twin"):
        assert live.push(live.acme, name, peft_adapter).status_code == 201
    before = live.resident_keys()
    cow = live.chat(live.acme, "cow@1")
    loaded = [key for key in live.resident_keys() if key not in before]
    assert len(loaded) == 1
    slots_used = live.engine.stats().adapter_slots_used
    assert live.chat(live.acme, "twin") == cow  # the same weights, so the same greedy answer
    assert live.engine.stats().adapter_slots_used == slots_used  # one slot for both names
    assert [key for key in live.resident_keys() if key not in before] == loaded
    assert loaded[0] in live.engine.engine.adapter_cache  # one host-cache entry, under the content key

    # globex holds the same bytes: its own slot and cache entry, so nothing tells it acme has them.
    assert live.push(live.globex, "cow", peft_adapter).status_code == 201
    assert live.chat(live.globex, "cow") == cow
    assert live.engine.stats().adapter_slots_used == slots_used + 1
    theirs = [key for key in live.resident_keys() if key not in before and key not in loaded]
    assert len(theirs) == 1 and theirs[0] in live.engine.engine.adapter_cache


def usage(live: Live, headers: dict[str, str], group_by: str) -> list[dict]:
    response = live.client.get("/v1/usage", params={"group_by": group_by}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def metric_samples(live: Live) -> dict[tuple[str, tuple], float]:
    text = live.client.get("/metrics", headers=live.operator).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_usage_and_metrics_name_adapters_per_tenant(live, peft_adapter, other_peft_adapter):
    assert live.push(live.acme, "moo", peft_adapter).status_code == 201
    assert live.push(live.acme, "moo", other_peft_adapter).status_code == 201
    assert live.client.put("/v1/adapters/moo/aliases/prod", json={"version": 1}, headers=live.acme).status_code == 200
    assert live.push(live.globex, "moo", peft_adapter).status_code == 201
    for model in ("moo:prod", "moo", "moo@2", "moo@1"):
        live.chat(live.acme, model)
    live.chat(live.globex, "moo")

    def acme_moo() -> list[dict]:
        return [bucket for bucket in usage(live, live.acme, "version") if bucket["adapter"] == "moo"]

    wait_until(lambda: sum(bucket["requests"] for bucket in acme_moo()) == 4, "acme's usage rows")
    assert [(b["adapter"], b["version"], b["requests"]) for b in acme_moo()] == [("moo", 1, 2), ("moo", 2, 2)]
    by_alias = [(b["alias"], b["requests"]) for b in usage(live, live.acme, "alias") if b["adapter"] == "moo"]
    assert by_alias == [(None, 2), ("latest", 1), ("prod", 1)]
    by_adapter = usage(live, live.acme, "adapter")
    assert ("moo", 4) in [(b["adapter"], b["requests"]) for b in by_adapter]
    for group_by in ("adapter", "version", "alias"):  # names only: a runtime key holds a "/"
        assert all("/" not in bucket["adapter"] for bucket in usage(live, live.acme, group_by))
    wait_until(lambda: [(b["version"], b["requests"]) for b in usage(live, live.globex, "version")
                        if b["adapter"] == "moo"] == [(1, 1)], "globex's usage row")

    samples = metric_samples(live)
    requests = "loraloom_adapter_requests_total"
    assert samples[(requests, (("adapter", "moo@1"), ("tenant", "acme")))] == 2
    assert samples[(requests, (("adapter", "moo@2"), ("tenant", "acme")))] == 2
    assert samples[(requests, (("adapter", "moo@1"), ("tenant", "globex")))] == 1  # a series of its own
    assert all(dict(labels).keys() == {"tenant", "adapter"}
               for name, labels in samples if name.startswith("loraloom_adapter_requests"))


def test_engine_status_lists_the_callers_resident_adapters_only(live, peft_adapter):
    assert live.push(live.acme, "stat", peft_adapter).status_code == 201
    live.chat(live.acme, "stat")
    status = live.client.get("/v1/engine/status", headers=live.acme)
    assert status.status_code == 200, status.text
    body = status.json()
    stat = [resident for resident in body["adapters"] if resident["adapter"] == "stat"]
    assert [(r["reference"], r["location"]) for r in stat] == [("stat@1", "gpu")]
    assert stat[0]["slot"] is not None
    assert body["server"] is None  # the engine-wide counters are the operator's (tests/platform/auth)
    # globex pushed nothing named stat, and acme's adapters are never listed to it.
    theirs = live.client.get("/v1/engine/status", headers=live.globex).json()["adapters"]
    assert all(resident["adapter"] != "stat" for resident in theirs)
