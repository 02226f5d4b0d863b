"""Who sets limits: the operator through GET/PUT /v1/tenants/{tenant}/limits and /v1/keys/{key_id}/limits,
and `loraloom admin limits` on the database; a tenant reads its own in GET /v1/me. Bad values are
400s naming the field, an unknown tenant or key a 404, anyone but the operator a 403. A change
applies from the next request."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key

from loraloom.platform.db.api_keys import create_api_key, find_api_key
from loraloom.platform.db.models import ApiKeyLimits, ApiKeyRole, TenantLimits
from loraloom.platform.limits.policy import caller_limits

LORALOOM = Path(sys.executable).parent / "loraloom"


def tenant_with_key(server, role: str = "inference") -> tuple[str, str, str]:
    """(tenant, key, key id) of a new tenant."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    key = make_key(server.settings, tenant=tenant, role=role)
    me = httpx.get(f"{server.url}/v1/me", headers=bearer(key)).json()
    return tenant, key, me["key_id"]


def put(server, path: str, body: dict, key: str | None = None) -> httpx.Response:
    return httpx.put(f"{server.url}{path}", json=body, headers=bearer(key or server.operator_key))


def test_the_operator_sets_a_tenants_limits_and_the_tenant_sees_them(limits_server):
    tenant, key, _ = tenant_with_key(limits_server)
    before = httpx.get(f"{limits_server.url}/v1/me", headers=bearer(key)).json()["limits"]
    assert before["tenant"]["requests_per_minute"] is None and before["tenant"]["share_weight"] == 1.0
    assert before["remaining"] == {"tenant": {}, "key": {}}

    body = {"requests_per_minute": 5, "tokens_per_minute": 900, "max_concurrent_requests": 2,
            "max_training_jobs": 1, "monthly_tokens": 10_000, "share_weight": 2.5}
    response = put(limits_server, f"/v1/tenants/{tenant}/limits", body)
    assert response.status_code == 200, response.text
    assert response.json() == {"object": "tenant.limits", "tenant": tenant, **body}
    assert httpx.get(f"{limits_server.url}/v1/tenants/{tenant}/limits",
                     headers=bearer(limits_server.operator_key)).json() == response.json()

    # From the tenant's next request on.
    assert httpx.post(f"{limits_server.url}/v1/completions", headers=bearer(key), timeout=120,
                      json={"model": "base", "prompt": "Hi", "max_tokens": 2}).status_code == 200
    limits = httpx.get(f"{limits_server.url}/v1/me", headers=bearer(key)).json()["limits"]
    assert {name: limits["tenant"][name] for name in body} == body
    left = limits["remaining"]["tenant"]
    assert left["requests"]["limit"] == 5 and left["requests"]["remaining"] == 4
    assert left["tokens"]["limit"] == 900 and left["tokens"]["remaining"] <= 900  # (it refills 15 a second)
    assert left["concurrent_requests"] == {
        "limit": 2, "remaining": 2, "reset_seconds": 0.0}
    assert 0 < left["monthly_tokens"]["remaining"] < 10_000

    # A PUT replaces them all: what it leaves out is unlimited again.
    cleared = put(limits_server, f"/v1/tenants/{tenant}/limits", {"requests_per_minute": 7}).json()
    assert cleared["requests_per_minute"] == 7 and cleared["monthly_tokens"] is None
    assert cleared["share_weight"] == 1.0


def test_the_operator_sets_a_keys_limits(limits_server):
    _, key, key_id = tenant_with_key(limits_server)
    response = put(limits_server, f"/v1/keys/{key_id}/limits", {"requests_per_minute": 1})
    assert response.status_code == 200, response.text
    assert response.json() == {"object": "api_key.limits", "key_id": key_id, "requests_per_minute": 1,
                               "tokens_per_minute": None, "max_concurrent_requests": None}
    me = httpx.get(f"{limits_server.url}/v1/me", headers=bearer(key)).json()["limits"]
    assert me["key"]["requests_per_minute"] == 1 and me["remaining"]["key"]["requests"]["remaining"] == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"requests_per_minute": -1}, "requests_per_minute"),
    ({"tokens_per_minute": 0}, "tokens_per_minute"),
    ({"monthly_tokens": 2**63}, "monthly_tokens"),
    ({"max_training_jobs": "many"}, "max_training_jobs"),
    ({"share_weight": 0}, "share_weight"),
    ({"rpm": 5}, "rpm"),
])
def test_bad_tenant_limits_are_400s_naming_the_field(limits_server, body, field):
    tenant, _, _ = tenant_with_key(limits_server)
    response = put(limits_server, f"/v1/tenants/{tenant}/limits", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_tenant_only_limits_on_a_key_are_400s(limits_server):
    _, _, key_id = tenant_with_key(limits_server)
    response = put(limits_server, f"/v1/keys/{key_id}/limits", {"monthly_tokens": 5})
    assert response.status_code == 400 and response.json()["error"]["param"] == "monthly_tokens"


def test_unknown_tenants_and_keys_are_404s(limits_server):
    assert put(limits_server, "/v1/tenants/no-such-tenant/limits", {}).status_code == 404
    missing = put(limits_server, f"/v1/keys/{uuid.uuid4()}/limits", {})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "key_id"
    assert httpx.get(f"{limits_server.url}/v1/tenants/no-such-tenant/limits",
                     headers=bearer(limits_server.operator_key)).status_code == 404


def test_only_the_operator_sets_or_reads_limits(limits_server):
    tenant, _, key_id = tenant_with_key(limits_server)
    tenant_admin = make_key(limits_server.settings, tenant=tenant, role="admin")
    for path in (f"/v1/tenants/{tenant}/limits", f"/v1/keys/{key_id}/limits"):
        assert put(limits_server, path, {"requests_per_minute": 10**6}, key=tenant_admin).status_code == 403
        assert httpx.get(f"{limits_server.url}{path}", headers=bearer(tenant_admin)).status_code == 403


def loraloom(args: list[str], settings) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LORALOOM_DATABASE_URL": settings.database_url, "LORALOOM_DATA_DIR": str(settings.data_dir)}
    return subprocess.run([str(LORALOOM), "admin", "limits", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_cli_sets_only_the_limits_named_and_the_server_applies_them(limits_server):
    tenant, key, key_id = tenant_with_key(limits_server)
    done = loraloom(["--tenant", tenant, "--rpm", "1", "--tpm", "5000", "--max-concurrent", "3",
                     "--max-training-jobs", "2", "--monthly-tokens", "100000", "--weight", "3"], limits_server.settings)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "tenant": tenant, "requests_per_minute": 1, "tokens_per_minute": 5000, "max_concurrent_requests": 3,
        "max_training_jobs": 2, "monthly_tokens": 100000, "share_weight": 3.0}
    changed = json.loads(loraloom(["--tenant", tenant, "--tpm", "none"], limits_server.settings).stdout)
    assert changed["tokens_per_minute"] is None and changed["requests_per_minute"] == 1  # the others kept
    on_key = loraloom(["--tenant", tenant, "--key", key_id, "--max-concurrent", "1"], limits_server.settings)
    assert json.loads(on_key.stdout) == {"tenant": tenant, "key_id": key_id, "requests_per_minute": None,
                                         "tokens_per_minute": None, "max_concurrent_requests": 1}
    body = {"model": "base", "prompt": "Hi", "max_tokens": 1}
    assert httpx.post(f"{limits_server.url}/v1/completions", headers=bearer(key), json=body,
                      timeout=120).status_code == 200
    assert httpx.post(f"{limits_server.url}/v1/completions", headers=bearer(key), json=body,
                      timeout=120).status_code == 429


@pytest.mark.parametrize(("args", "message"), [
    (["--tenant", "no-such-tenant", "--rpm", "5"], "does not exist"),
    (["--tenant", "default", "--rpm", "-5"], "--rpm"),
    (["--tenant", "default", "--weight", "0"], "--weight"),
    (["--tenant", "default", "--key", str(uuid.uuid4())], "--key"),
])
def test_the_cli_refuses_bad_input(limits_server, args, message):
    done = loraloom(args, limits_server.settings)
    assert done.returncode != 0 and done.stdout == "" and message in done.stderr


def test_a_keys_limits_and_its_tenants_come_with_the_key_in_one_query(session_factory):
    with session_factory.begin() as session:
        from live_api import new_tenant

        tenant = new_tenant(session)
        key, plaintext = create_api_key(session, tenant_id=tenant.id, name="k", role=ApiKeyRole.inference)
        session.flush()
        session.add(TenantLimits(tenant_id=tenant.id, requests_per_minute=3, share_weight=2.0))
        session.add(ApiKeyLimits(api_key_id=key.id, max_concurrent_requests=4))
    with session_factory() as session:
        found = find_api_key(session, plaintext)
    # Detached from its session: had the limits not come with the key, reading them would fail here.
    limits = caller_limits(found)
    assert limits.tenant.requests_per_minute == 3 and limits.share_weight == 2.0
    assert limits.key.max_concurrent_requests == 4 and limits.key.requests_per_minute is None


def test_the_openapi_document_describes_the_limits(limits_server):
    document = httpx.get(f"{limits_server.url}/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = document["paths"][path]["post"]["responses"]
        assert {"429", "503"} <= set(responses)
        assert "retry-after-ms" in responses["429"]["headers"]
        assert "x-ratelimit-remaining-tokens" in responses["200"]["headers"]
    assert {"get", "put"} <= set(document["paths"]["/v1/tenants/{tenant}/limits"])
    assert {"get", "put"} <= set(document["paths"]["/v1/keys/{key_id}/limits"])
    me = document["components"]["schemas"]["MeObject"]["properties"]
    assert "limits" in me
