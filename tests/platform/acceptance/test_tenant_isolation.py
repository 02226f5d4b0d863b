"""Tenant isolation over HTTP: globex cannot see, use or change acme's adapter, and every answer
it gets is the answer for an adapter that never existed, but for the name it typed."""
from __future__ import annotations

import json

import httpx
import pytest

SECRET = "isolated-bot"  # acme's
MISSING = "never-was-bot"  # nobody's
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def files_of(directory) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [
        ("files", (name, (directory / name).read_bytes(), "application/octet-stream"))
        for name in ("adapter_config.json", "adapter_model.safetensors")
    ]


@pytest.fixture(scope="module")
def acme_adapter(live) -> None:
    """acme's adapter with versions 1 and 2 and `prod` on version 1 (so `prod` has a history)."""
    with live.http("acme-developer") as acme:
        for version in ("v1", "v2"):
            assert acme.post(f"/v1/adapters/{SECRET}/versions", files=files_of(live.adapters[version])).status_code == 201
        assert acme.put(f"/v1/adapters/{SECRET}/aliases/prod", json={"version": 1}).status_code == 200


# (method, path or generation route, request) with {name} standing for the adapter name typed.
PROBES = {
    "read adapter": ("GET", "/v1/adapters/{name}", None),
    "list versions": ("GET", "/v1/adapters/{name}/versions", None),
    "read version": ("GET", "/v1/adapters/{name}/versions/1", None),
    "read alias": ("GET", "/v1/adapters/{name}/aliases/prod", None),
    "read latest alias": ("GET", "/v1/adapters/{name}/aliases/latest", None),
    "alias history": ("GET", "/v1/adapters/{name}/aliases/prod/history", None),
    "move alias": ("PUT", "/v1/adapters/{name}/aliases/prod", {"version": 2}),
    "create alias": ("PUT", "/v1/adapters/{name}/aliases/staging", {"version": 1}),
    "delete alias": ("DELETE", "/v1/adapters/{name}/aliases/prod", None),
    "delete version": ("DELETE", "/v1/adapters/{name}/versions/1", None),
    "force-delete version": ("DELETE", "/v1/adapters/{name}/versions/1?force=true", None),
    "delete adapter": ("DELETE", "/v1/adapters/{name}", None),
    **{
        f"{route} {reference}": ("POST", f"/v1/{route}", {"model": reference, **body})
        for route, body in (
            ("chat/completions", {"messages": CHAT, "max_tokens": 2, "temperature": 0}),
            ("completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}),
        )
        for reference in ("{name}", "{name}:prod", "{name}:latest", "{name}@1")
    },
    "chat with adapter_id": (
        "POST", "/v1/chat/completions", {"model": "base", "adapter_id": "{name}:prod", "messages": CHAT, "max_tokens": 2}
    ),
}


def probe(client: httpx.Client, name: str, method: str, path: str, body: dict | None) -> httpx.Response:
    filled = None if body is None else json.loads(json.dumps(body).replace("{name}", name))
    return client.request(method, path.replace("{name}", name), json=filled)


@pytest.mark.parametrize("case", list(PROBES))
def test_another_tenants_adapter_answers_exactly_like_a_missing_one(live, acme_adapter, case):
    method, path, body = PROBES[case]
    before = live.state()
    with live.http("globex-developer") as globex:
        theirs = probe(globex, SECRET, method, path, body)
        missing = probe(globex, MISSING, method, path, body)
    assert theirs.status_code == missing.status_code == 404, (theirs.text, missing.text)
    assert theirs.headers["content-type"] == missing.headers["content-type"]
    # The same body, key for key, but for the name typed.
    assert theirs.text == missing.text.replace(MISSING, SECRET)
    assert SECRET in theirs.json()["error"]["message"]
    assert live.state() == before  # nothing was changed, not even by the refused writes
    with live.http("acme-developer") as acme:  # and acme's adapter is as it was
        assert acme.get(f"/v1/adapters/{SECRET}").json()["aliases"] == {"latest": 2, "prod": 1}
        assert [v["version"] for v in acme.get(f"/v1/adapters/{SECRET}/versions").json()["data"]] == [1, 2]


def test_another_tenants_adapter_is_not_listed(live, acme_adapter):
    with live.http("acme-developer") as acme, live.http("globex-developer") as globex:
        assert SECRET in [a["name"] for a in acme.get("/v1/adapters").json()["data"]]
        assert SECRET not in [a["name"] for a in globex.get("/v1/adapters", params={"limit": 100}).json()["data"]]
        listed_after = globex.get("/v1/adapters", params={"after": ""}).json()["data"]
        assert SECRET not in [a["name"] for a in listed_after]
        assert not any(m["id"].startswith(SECRET) for m in globex.get("/v1/models").json()["data"])
        assert any(m["id"].startswith(SECRET) for m in acme.get("/v1/models").json()["data"])


def test_the_same_name_in_another_tenant_is_a_separate_adapter(live, acme_adapter):
    """globex may use the name too: it gets its own version 1, and acme's adapter does not move."""
    with live.http("globex-developer") as globex, live.http("acme-developer") as acme:
        created = globex.post(f"/v1/adapters/{SECRET}/versions", files=files_of(live.adapters["v2"]))
        assert created.status_code == 201, created.text
        assert (created.json()["version"], created.json()["aliases"]) == (1, ["latest"])
        assert globex.get(f"/v1/adapters/{SECRET}").json()["aliases"] == {"latest": 1}
        assert acme.get(f"/v1/adapters/{SECRET}").json()["aliases"] == {"latest": 2, "prod": 1}
        # globex's own name resolves to globex's version, never to acme's `prod`.
        assert globex.get(f"/v1/adapters/{SECRET}/aliases/prod").status_code == 404
        assert globex.delete(f"/v1/adapters/{SECRET}").status_code == 200
        assert acme.get(f"/v1/adapters/{SECRET}/versions/1").status_code == 200
        # The blobs globex's deleted version shared with acme's version 2 are still there to serve it.
        served = acme.post("/v1/completions", json={"model": f"{SECRET}@2", "prompt": "Hello", "max_tokens": 2})
        assert served.status_code == 200, served.text
