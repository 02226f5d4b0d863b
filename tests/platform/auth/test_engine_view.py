"""GET /v1/engine/status: a tenant's view holds only its own requests and adapters, so another
tenant's traffic changes nothing in it; the operator's view adds the whole engine's counters,
which that traffic does move."""
from __future__ import annotations

import httpx
from live_api import bearer, wait_until


def status(access_server, who: str) -> dict:
    response = httpx.get(f"{access_server.url}/v1/engine/status", headers=bearer(access_server.keys[who]), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def engine_idle(access_server) -> bool:
    stats = access_server.engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0


def test_another_tenants_request_changes_nothing_in_a_tenants_view(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    before = {who: status(access_server, who) for who in ("globex", "operator")}
    body = {"model": "base", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    reply = httpx.post(f"{access_server.url}/v1/completions", json=body,
                       headers=bearer(access_server.keys["inference"]), timeout=120)  # tenant acme
    assert reply.status_code == 200, reply.text
    after = {who: status(access_server, who) for who in ("globex", "operator")}
    assert after["globex"] == before["globex"]
    assert before["globex"]["server"] is None
    # `device` is a fact of the server, like `model`: nothing in it moves with anyone's traffic.
    # `speculation` is the tenant's own drafts only: the request above (acme's) left globex's as it was.
    assert set(before["globex"]) == {"object", "model", "device", "num_running", "num_waiting", "adapters",
                                     "speculation", "server"}
    assert before["globex"]["device"] == "cpu"
    # The operator's view is the whole engine's: acme's tokens show there.
    prompt_tokens = reply.json()["usage"]["prompt_tokens"]
    server_before, server_after = before["operator"]["server"], after["operator"]["server"]
    assert server_after["prompt_tokens_total"] - server_before["prompt_tokens_total"] == prompt_tokens
    assert server_after["generation_tokens_total"] > server_before["generation_tokens_total"]


def test_a_tenants_view_counts_its_own_requests_only(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    # Long enough to be still running while the views are read; leaving the block aborts it.
    body = {"model": "base", "prompt": "Count to a thousand:", "max_tokens": 900, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=access_server.url, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json=body, headers=bearer(access_server.keys["developer"])) as stream:
            assert stream.status_code == 200
            # Held in a name: an iterator dropped after next() closes the stream, and the server then
            # aborts the request (a client that left) before the views below are read.
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # running now
            operator = status(access_server, "operator")
            mine, theirs = status(access_server, "admin"), status(access_server, "globex")  # acme's admin, globex
    assert (mine["num_running"], mine["num_waiting"]) == (1, 0)
    assert (theirs["num_running"], theirs["num_waiting"]) == (0, 0)
    assert operator["num_running"] == 0 and operator["server"]["num_running"] == 1  # default's own: none
