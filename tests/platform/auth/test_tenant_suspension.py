"""The operator suspends a tenant: each of its keys is refused with 403 `tenant_suspended` (OpenAI's
error shape, naming the tenant), its streams in flight end with that error as their last event, and
resuming lets the same keys in again. Only the operator may do it, and not to its own tenant."""
from __future__ import annotations

import httpx
import pytest
from live_api import bearer, wait_until
from test_revocation import engine_idle, stream_until_error


def operator_call(access_server, method: str, path: str, **body) -> httpx.Response:
    return httpx.request(method, f"{access_server.url}{path}", headers=bearer(access_server.keys["operator"]),
                         timeout=60, **({"json": body} if body else {}))


def tenant_with_key(access_server, name: str) -> str:
    """A new tenant and a developer key of it, both made by the operator through the API."""
    assert operator_call(access_server, "POST", "/v1/tenants", name=name).status_code == 201
    created = operator_call(access_server, "POST", "/v1/keys", name="app", role="developer", tenant=name)
    assert created.status_code == 201, created.text
    return created.json()["key"]


def me(access_server, key: str) -> httpx.Response:
    return httpx.get(f"{access_server.url}/v1/me", headers=bearer(key), timeout=60)


def test_a_suspended_tenant_s_keys_get_403_until_it_is_resumed(access_server):
    key = tenant_with_key(access_server, "initech")
    assert me(access_server, key).status_code == 200

    suspended = operator_call(access_server, "POST", "/v1/tenants/initech/suspend")
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["suspended_at"] is not None
    listed = {tenant["name"]: tenant for tenant in operator_call(access_server, "GET", "/v1/tenants").json()["data"]}
    assert listed["initech"]["suspended_at"] == suspended.json()["suspended_at"]
    assert listed["acme"]["suspended_at"] is None

    refused = me(access_server, key)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "tenant_suspended"
    assert "'initech'" in error["message"] and "resumes it" in error["message"]
    # Another tenant's keys are untouched.
    assert me(access_server, access_server.keys["developer"]).status_code == 200

    resumed = operator_call(access_server, "POST", "/v1/tenants/initech/resume")
    assert resumed.status_code == 200 and resumed.json()["suspended_at"] is None
    assert me(access_server, key).status_code == 200


def test_only_the_operator_suspends_and_never_its_own_tenant(access_server):
    for who in ("admin", "developer"):
        refused = httpx.post(f"{access_server.url}/v1/tenants/acme/suspend", headers=bearer(access_server.keys[who]),
                             timeout=60)
        assert refused.status_code == 403 and refused.json()["error"]["code"] in {"operator_only", "insufficient_role"}
    own = operator_call(access_server, "POST", "/v1/tenants/default/suspend")
    assert own.status_code == 409 and own.json()["error"]["param"] == "tenant"
    missing = operator_call(access_server, "POST", "/v1/tenants/no-such-tenant/suspend")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "tenant_not_found"
    assert me(access_server, access_server.keys["operator"]).status_code == 200


@pytest.mark.timeout(300)
def test_suspending_a_tenant_ends_its_streams_in_flight(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    key = tenant_with_key(access_server, "hooli")

    def suspend() -> None:
        assert operator_call(access_server, "POST", "/v1/tenants/hooli/suspend").status_code == 200

    error, after = stream_until_error(access_server, key, suspend)
    assert error["code"] == "tenant_suspended" and after == []
    wait_until(lambda: engine_idle(access_server), "the ended request to free its KV blocks")
    operator_call(access_server, "POST", "/v1/tenants/hooli/resume")
