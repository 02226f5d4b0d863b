"""Issue 12 item 3: admin keys were global, so an admin key of tenant tb created keys in ta and read
ta's keys and usage. The operator (an admin key of tenant "default", the bootstrap key among them)
acts on every tenant; an admin key of any other tenant administers its own tenant only."""
from __future__ import annotations

import uuid

import httpx
import pytest
from live_api import bearer, migrated_settings

from loraloom.platform.accounts.keys import OPERATOR_TENANT, create_bootstrap_admin_key, is_operator_key
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.api_keys import find_api_key


@pytest.fixture(scope="module")
def clients(auth_server):
    def client(name: str) -> httpx.Client:
        return httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(auth_server.keys[name]))

    with client("admin") as operator, client("tenant-admin") as acme_admin, client("other") as umbrella:
        yield operator, acme_admin, umbrella


def umbrella_key_id(operator: httpx.Client) -> str:
    created = operator.post("/v1/keys", json={"name": "umbrella-ci", "role": "inference", "tenant": "umbrella"})
    assert created.status_code == 201, created.text
    return created.json()["id"]


@pytest.mark.parametrize("method, path, body, params", [
    ("POST", "/v1/keys", {"name": "sneaky", "role": "admin", "tenant": "umbrella"}, None),
    ("GET", "/v1/keys", None, {"tenant": "umbrella"}),
    ("GET", "/v1/usage", None, {"tenant": "umbrella"}),
    ("GET", "/v1/usage", None, {"tenant": OPERATOR_TENANT}),
])
def test_a_tenant_admin_cannot_act_on_another_tenant_and_learns_nothing_of_it(clients, method, path, body, params):
    _, acme_admin, _ = clients
    existing = acme_admin.request(method, path, json=body, params=params)
    assert existing.status_code == 403, existing.text
    assert existing.json()["error"]["param"] == "tenant"
    # The same request naming a tenant that does not exist gets the same answer, name aside.
    swap = lambda value: value.replace("umbrella", "nobody").replace(OPERATOR_TENANT, "nobody")  # noqa: E731
    missing = acme_admin.request(
        method, path, json=None if body is None else {**body, "tenant": "nobody"},
        params=None if params is None else {"tenant": "nobody"},
    )
    assert missing.status_code == 403
    assert swap(existing.json()["error"]["message"]) == missing.json()["error"]["message"]


def test_a_tenant_admin_cannot_revoke_another_tenant_s_key_which_answers_like_a_missing_one(clients, auth_server):
    operator, acme_admin, _ = clients
    key_id = umbrella_key_id(operator)
    foreign = acme_admin.delete(f"/v1/keys/{key_id}")
    assert foreign.status_code == 404
    missing = acme_admin.delete(f"/v1/keys/{uuid.uuid4()}")
    assert foreign.json()["error"]["code"] == missing.json()["error"]["code"] == "key_not_found"
    assert operator.get("/v1/keys", params={"tenant": "umbrella"}).json()["data"][-1]["revoked_at"] is None


def test_tenants_are_the_operator_s_alone(clients):
    _, acme_admin, _ = clients
    for response in (acme_admin.post("/v1/tenants", json={"name": "acme-two"}), acme_admin.get("/v1/tenants")):
        assert response.status_code == 403 and response.json()["error"]["code"] == "operator_only"


def test_a_tenant_admin_manages_its_own_tenant(clients):
    _, acme_admin, _ = clients
    created = acme_admin.post("/v1/keys", json={"name": "acme-ci", "role": "developer"})
    assert created.status_code == 201
    assert acme_admin.post("/v1/keys", json={"name": "acme-ci2", "role": "inference", "tenant": "acme"}).status_code == 201
    listed = acme_admin.get("/v1/keys").json()["data"]
    assert created.json()["id"] in {key["id"] for key in listed}
    assert {key["tenant_id"] for key in listed} == {created.json()["tenant_id"]}
    assert acme_admin.get("/v1/usage").json()["tenant"] == "acme"
    assert acme_admin.delete(f"/v1/keys/{created.json()['id']}").status_code == 200


def test_the_operator_acts_on_every_tenant(clients):
    operator, _, _ = clients
    key_id = umbrella_key_id(operator)
    assert key_id in {key["id"] for key in operator.get("/v1/keys", params={"tenant": "umbrella"}).json()["data"]}
    assert operator.get("/v1/usage", params={"tenant": "umbrella"}).json()["tenant"] == "umbrella"
    assert operator.delete(f"/v1/keys/{key_id}").json()["revoked_at"] is not None
    assert operator.post("/v1/tenants", json={"name": "initech-two"}).status_code == 201


def test_the_bootstrap_key_is_the_operator(tmp_path):
    settings = migrated_settings(tmp_path)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            plaintext = create_bootstrap_admin_key(session)
            key = find_api_key(session, plaintext)
            assert is_operator_key(key, key.tenant.name)
    finally:
        engine.dispose()
