"""Split aliases through the API and the engine (the bundled model, `max_tokens: 1`): the alias object
and its history, the response's `model` naming the version that served, a user kept on one version,
usage and Prometheus figures per version, promote and rollback, bad splits refused naming the field,
another tenant's adapter out of reach, and the CLI's `adapters alias` commands."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from live_api import bearer, make_key, migrated_settings, wait_until
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import ADAPTER_FILES
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.cli.adapter_alias import adapters_alias
from loraloom.platform.cli.main import build_parser
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

SIGMAS = 4.5
REQUESTS = 60


@dataclass
class Api:
    app: FastAPI
    client: TestClient
    developer: dict[str, str]  # acme
    globex: dict[str, str]  # another tenant's developer
    operator: dict[str, str]  # /metrics

    def complete(self, model: str, **fields) -> str:
        """One completion of one token; the response's `model`."""
        response = self.client.post("/v1/completions", headers=self.developer,
                                    json={"model": model, "prompt": "Hello", "max_tokens": 1, **fields})
        assert response.status_code == 200, response.text
        return response.json()["model"]

    def put(self, path: str, body: dict, headers=None):
        return self.client.put(f"/v1/adapters/{path}", json=body, headers=headers or self.developer)

    def post(self, path: str, body: dict | None = None, headers=None):
        return self.client.post(f"/v1/adapters/{path}", json=body, headers=headers or self.developer)

    def metric(self, name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(self.client.get("/metrics", headers=self.operator).text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return 0.0


@pytest.fixture(scope="module")
def api(model_dir, peft_adapter, other_peft_adapter, tmp_path_factory) -> Iterator[Api]:
    settings = migrated_settings(tmp_path_factory.mktemp("server"))
    keys = {role: bearer(make_key(settings, tenant=tenant, role=kind)) for role, tenant, kind in
            (("developer", "acme", "developer"), ("globex", "globex", "developer"), ("operator", "default", "admin"))}
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    app = compose_app(settings, engine)
    with TestClient(app) as client:
        api = Api(app, client, **keys)
        for directory in (peft_adapter, other_peft_adapter):
            files = [("files", (name, (directory / name).read_bytes(), "application/octet-stream"))
                     for name in ADAPTER_FILES]
            assert client.post("/v1/adapters/bot/versions", files=files, headers=api.developer).status_code == 201
        yield api


@pytest.fixture
def prod(api) -> str:
    """bot:prod pointing at version 1 alone, whatever a previous test left."""
    assert api.put("bot/aliases/prod", {"version": 1}).status_code == 200
    return "bot/aliases/prod"


def test_a_split_serves_both_versions_by_weight_and_names_the_one_that_served(api, prod):
    answer = api.put(prod, {"split": [{"version": 2, "weight": 1}, {"version": 1, "weight": 1}]})
    assert answer.status_code == 200, answer.text
    alias = answer.json()
    # The split by version; `version` is the largest weight's, the older on a tie.
    assert (alias["version"], alias["split"]) == (1, [{"version": 1, "weight": 1}, {"version": 2, "weight": 1}])
    assert api.client.get(f"/v1/adapters/{prod}", headers=api.developer).json()["split"] == alias["split"]
    assert sorted(api.client.get("/v1/adapters/bot/versions/2", headers=api.developer).json()["aliases"]) == [
        "latest", "prod"]

    served = Counter(api.complete("bot:prod") for _ in range(REQUESTS))
    assert set(served) == {"bot@1", "bot@2"}  # the response names the version, never the alias
    assert abs(served["bot@2"] - REQUESTS / 2) <= SIGMAS * math.sqrt(REQUESTS / 4), served
    kept = {api.complete("bot:prod", user="alice") for _ in range(8)}
    assert len(kept) == 1  # one user, one version
    served[kept.pop()] += 8
    # A request naming a version, or the base, gets its name back unchanged; a bare name follows `latest`.
    assert (api.complete("bot@1"), api.complete("base"), api.complete("bot")) == ("bot@1", "base", "bot@2")
    served["bot@1"] += 1
    served["bot@2"] += 1

    # Usage tells the versions behind the alias apart; so does the engine's per-adapter counter and histogram.
    def by_alias_version() -> dict:
        rows = api.client.get("/v1/usage", params={"group_by": "alias_version"}, headers=api.developer).json()["data"]
        return {(row["adapter"], row["alias"], row["version"]): row["requests"] for row in rows}

    wait_until(lambda: sum(by_alias_version().values()) == REQUESTS + 8 + 3, "the usage rows")
    usage = by_alias_version()
    assert (usage[("bot", None, 1)], usage[("bot", "latest", 2)], usage[("base", None, None)]) == (1, 1, 1)
    for version in (1, 2):
        assert usage[("bot", "prod", version)] + 1 == served[f"bot@{version}"]
        assert api.metric("loraloom_adapter_requests_total", tenant="acme", adapter=f"bot@{version}") == \
            served[f"bot@{version}"]
        assert api.metric("loraloom_e2e_request_latency_seconds_count", tenant="acme", model=f"bot@{version}") == \
            served[f"bot@{version}"]
        latency = api.client.get("/v1/usage/latency", params={"adapter": "bot", "version": version},
                                 headers=api.developer).json()
        assert latency["version"] == version
        assert sum(point["requests"] for point in latency["data"]) == served[f"bot@{version}"]


def test_promote_and_rollback_are_one_call_each_and_in_the_history(api, prod):
    assert api.post(f"{prod}/promote").status_code == 409  # not split
    assert api.put(prod, {"split": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}).status_code == 200
    promoted = api.post(f"{prod}/promote")
    assert promoted.status_code == 200 and (promoted.json()["version"], promoted.json()["split"]) == (2, None)
    assert {api.complete("bot:prod") for _ in range(4)} == {"bot@2"}

    assert api.put(prod, {"split": [{"version": 1, "weight": 10}, {"version": 2, "weight": 90}]}).status_code == 200
    rolled_back = api.post(f"{prod}/rollback")
    assert rolled_back.status_code == 200 and rolled_back.json()["version"] == 2  # what prod named before the split
    assert api.post(f"{prod}/rollback").status_code == 409

    assert api.put(prod, {"split": [{"version": 1, "weight": 10}, {"version": 2, "weight": 90}]}).status_code == 200
    assert api.post(f"{prod}/promote", {"version": 1}).json()["version"] == 1
    history = api.client.get(f"/v1/adapters/{prod}/history", headers=api.developer).json()["data"]
    assert [h["action"] for h in history[-7:]] == ["set", "split", "promote", "split", "rollback", "split", "promote"]
    assert [(h["from_version"], h["to_version"], h["split"]) for h in history[-6:]] == [
        (1, 1, [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]),
        (1, 2, None),
        (2, 2, [{"version": 1, "weight": 10}, {"version": 2, "weight": 90}]),  # the largest weight's version
        (2, 2, None),  # back to version 2, which prod named alone before the split
        (2, 2, [{"version": 1, "weight": 10}, {"version": 2, "weight": 90}]),
        (2, 1, None),
    ]
    moved = api.put(prod, {"version": 2}).json()
    assert (moved["version"], moved["split"]) == (2, None)


@pytest.mark.parametrize(
    ("body", "alias", "param", "says"),
    [
        ({"split": [{"version": 1, "weight": 50}, {"version": 1, "weight": 50}]}, "prod", "split[1].version", "already"),
        ({"split": [{"version": 1, "weight": 50}, {"version": 9, "weight": 50}]}, "prod", "split[1].version", "no version 9"),
        ({"split": [{"version": 1, "weight": 50}, {"version": 2, "weight": 0}]}, "prod", "split[1].weight", "greater"),
        ({"split": [{"version": 1, "weight": 50}, {"version": 2}]}, "prod", "split[1].weight", "required"),
        ({"split": [{"version": 1, "weight": 100}]}, "prod", "split", "at least 2"),
        ({"split": [{"version": 1, "weight": 1}, {"version": 2, "weight": 1}], "version": 1}, "prod", "split", "not both"),
        ({}, "prod", "version", "one of them"),
        ({"split": [{"version": 1, "weight": 1}, {"version": 2, "weight": 1}]}, "latest", "alias", "moves by itself"),
    ],
)
def test_bad_splits_are_400s_naming_the_field(api, prod, body, alias, param, says):
    refused = api.put(f"bot/aliases/{alias}", body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert api.client.get(f"/v1/adapters/{prod}", headers=api.developer).json()["split"] is None


def test_another_tenants_alias_cannot_be_split_promoted_or_rolled_back(api, prod):
    split = {"split": [{"version": 1, "weight": 1}, {"version": 2, "weight": 1}]}
    assert api.put(prod, split, headers=api.globex).status_code == 404
    assert api.post(f"{prod}/promote", headers=api.globex).status_code == 404
    assert api.post(f"{prod}/rollback", headers=api.globex).status_code == 404
    assert api.client.get(f"/v1/adapters/{prod}", headers=api.developer).json()["split"] is None


def test_the_cli_splits_promotes_rolls_back_and_shows(api, prod, capsys):
    parser = build_parser()
    cli = TestClient(api.app, headers=api.developer)  # an httpx client over the same app, as the CLI's

    def run(*argv: str) -> str:
        adapters_alias(cli, parser.parse_args(["adapters", "alias", *argv]))
        captured = capsys.readouterr()
        return captured.out + captured.err

    assert run("set", "bot", "prod", "--split", "1=90,2=10") == "bot:prod -> bot@1 (90), bot@2 (10)\n"
    assert run("promote", "bot", "prod") == "bot:prod -> bot@2\n"
    assert run("set", "bot", "prod", "--split", "2=95,1=5") == "bot:prod -> bot@1 (5), bot@2 (95)\n"
    assert run("rollback", "bot", "prod") == "bot:prod -> bot@2\n"
    assert run("set", "bot", "prod", "1") == "bot:prod -> bot@1\n"
    shown = run("show", "bot", "prod").splitlines()
    assert shown[0] == "bot:prod -> bot@1"
    assert [line.split()[1:] for line in shown[-5:]] == [
        ["split", "bot@1", "(90),", "bot@2", "(10)"], ["promote", "bot@2"], ["split", "bot@1", "(5),", "bot@2", "(95)"],
        ["rollback", "bot@2"], ["set", "bot@1"]]
