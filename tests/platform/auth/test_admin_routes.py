"""Tenants and keys through the live API, and the audit log rows their calls leave."""
from __future__ import annotations

import uuid

import httpx
import pytest
from live_api import bearer, wait_until
from sqlalchemy import select

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.api_keys import hash_api_key
from loraloom.platform.db.models import ApiKey, AuditLogEntry, Tenant


@pytest.fixture(scope="module")
def db(auth_server):
    engine = create_db_engine(auth_server.settings.database_url)
    yield create_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def admin(auth_server) -> httpx.Client:
    with httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(auth_server.keys["admin"])) as client:
        yield client


def key_id_of(db, plaintext: str) -> uuid.UUID:
    with db() as session:
        return session.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_api_key(plaintext)))


def audit_rows(db, **match) -> list[AuditLogEntry]:
    with db() as session:
        rows = session.scalars(select(AuditLogEntry).order_by(AuditLogEntry.id)).all()
    return [row for row in rows if all(getattr(row, field) == value for field, value in match.items())]


def wait_for_audit(db, **match) -> AuditLogEntry:
    wait_until(lambda: len(audit_rows(db, **match)) > 0, f"an audit row with {match}")
    rows = audit_rows(db, **match)
    assert len(rows) == 1, rows
    return rows[0]


def test_tenants_are_created_listed_and_validated(admin, db):
    created = admin.post("/v1/tenants", json={"name": "initech"})
    assert created.status_code == 201, created.text
    tenant = created.json()
    assert tenant["object"] == "tenant" and tenant["name"] == "initech"
    with db() as session:
        assert str(session.scalar(select(Tenant.id).where(Tenant.name == "initech"))) == tenant["id"]
    names = [t["name"] for t in admin.get("/v1/tenants").json()["data"]]
    assert names == sorted(names) and {"default", "acme", "umbrella", "initech"} <= set(names)

    duplicate = admin.post("/v1/tenants", json={"name": "initech"})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "tenant_exists"
    bad = admin.post("/v1/tenants", json={"name": "Not Valid!"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"


def test_created_key_is_shown_once_works_with_its_role_and_is_listed_without_secret(auth_server, admin, db):
    created = admin.post("/v1/keys", json={"name": "ci", "role": "inference", "tenant": "acme"})
    assert created.status_code == 201, created.text
    body = created.json()
    key = body["key"]
    assert key.startswith("ll-") and len(key) >= 40 and body["prefix"] == key[: len(body["prefix"])]
    assert body["role"] == "inference" and body["revoked_at"] is None
    with db() as session:
        row = session.get(ApiKey, uuid.UUID(body["id"]))
        assert row.key_hash == hash_api_key(key) and row.tenant.name == "acme"

    with httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(key)) as new_key:
        assert new_key.get("/v1/models").status_code == 200
        assert new_key.get("/v1/keys").status_code == 403  # inference role

    listed = {k["id"]: k for k in admin.get("/v1/keys", params={"tenant": "acme"}).json()["data"]}
    entry = listed[body["id"]]
    assert entry["prefix"] == body["prefix"] and entry["role"] == "inference"
    assert "key" not in entry and all(key not in str(value) for value in entry.values())
    assert set(entry) >= {"last_used_at", "created_at", "expires_at", "revoked_at"}
    # The caller's own tenant by default: the admin's tenant is "default", not acme.
    assert body["id"] not in {k["id"] for k in admin.get("/v1/keys").json()["data"]}


def test_developer_lists_only_its_own_tenants_keys(auth_server, db):
    with httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(auth_server.keys["developer"])) as dev:
        own = dev.get("/v1/keys")
        assert own.status_code == 200
        ids = {k["id"] for k in own.json()["data"]}
        assert str(key_id_of(db, auth_server.keys["developer"])) in ids
        assert str(key_id_of(db, auth_server.keys["inference"])) in ids
        assert str(key_id_of(db, auth_server.keys["other"])) not in ids
        assert dev.get("/v1/keys", params={"tenant": "acme"}).status_code == 200
        other = dev.get("/v1/keys", params={"tenant": "umbrella"})
        assert other.status_code == 403 and other.json()["error"]["param"] == "tenant"


def test_keys_for_missing_tenants_and_past_expiry_are_refused(admin):
    missing = admin.post("/v1/keys", json={"name": "x", "role": "developer", "tenant": "nobody"})
    assert missing.status_code == 404 and "nobody" in missing.json()["error"]["message"]
    past = admin.post("/v1/keys", json={"name": "x", "role": "developer", "expires_at": "2001-01-01T00:00:00Z"})
    assert past.status_code == 400 and past.json()["error"]["param"] == "expires_at"
    naive = admin.post("/v1/keys", json={"name": "x", "role": "developer", "expires_at": "2999-01-01T00:00:00"})
    assert naive.status_code == 400 and naive.json()["error"]["param"] == "expires_at"
    bad_role = admin.post("/v1/keys", json={"name": "x", "role": "root"})
    assert bad_role.status_code == 400 and bad_role.json()["error"]["param"] == "role"


def test_revoked_key_is_refused_at_once(auth_server, admin):
    key = admin.post("/v1/keys", json={"name": "short-lived", "role": "developer"}).json()
    with httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(key["key"])) as client:
        assert client.get("/v1/keys").status_code == 200
        revoked = admin.delete(f"/v1/keys/{key['id']}")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        refused = client.get("/v1/keys")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "api_key_revoked"
    again = admin.delete(f"/v1/keys/{key['id']}")
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]  # revoking twice keeps the first time
    missing = admin.delete(f"/v1/keys/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"


def test_mutating_calls_are_audited_with_actor_resource_and_outcome(auth_server, admin, db):
    admin_id = key_id_of(db, auth_server.keys["admin"])
    with db() as session:
        admin_tenant = session.get(ApiKey, admin_id).tenant_id

    created = admin.post("/v1/keys", json={"name": "audited", "role": "inference"}, headers={"X-Request-ID": "req-42"})
    row = wait_for_audit(db, action="POST /v1/keys", resource_id=created.json()["id"])
    assert (row.tenant_id, row.actor_key_id, row.status_code) == (admin_tenant, admin_id, 201)
    assert row.resource_type == "keys" and row.request_id == "req-42" and row.client_ip == "127.0.0.1"
    assert created.json()["key"] not in str(row.details)

    admin.delete(f"/v1/keys/{created.json()['id']}")
    row = wait_for_audit(db, action="DELETE /v1/keys/{key_id}", resource_id=created.json()["id"])
    assert row.status_code == 200 and row.details["path_params"] == {"key_id": created.json()["id"]}

    # Refused calls are audited too: with the actor when known, without when authentication failed.
    developer_id = key_id_of(db, auth_server.keys["developer"])
    httpx.post(f"{auth_server.url}/v1/tenants", json={"name": "sneaky"}, headers=bearer(auth_server.keys["developer"]))
    row = wait_for_audit(db, action="POST /v1/tenants", actor_key_id=developer_id)
    assert row.status_code == 403 and "'admin'" in row.details["error"]
    httpx.post(f"{auth_server.url}/v1/tenants", json={"name": "anonymous"}, headers={"X-Request-ID": "anon-1"})
    row = wait_for_audit(db, action="POST /v1/tenants", request_id="anon-1")
    assert (row.status_code, row.actor_key_id, row.tenant_id) == (401, None, None)


def test_inference_and_reads_are_not_audited(auth_server, db):
    before = len(audit_rows(db))
    headers = {**bearer(auth_server.keys["inference"]), "X-Request-ID": "not-audited"}
    body = {"model": "base", "prompt": "Hi", "max_tokens": 1}
    assert httpx.post(f"{auth_server.url}/v1/completions", json=body, headers=headers, timeout=300).status_code == 200
    assert httpx.get(f"{auth_server.url}/v1/models", headers=headers, timeout=60).status_code == 200
    # A mutating call after them: once its row is in, anything written before it would be too.
    httpx.post(f"{auth_server.url}/v1/tenants", json={"name": "marker"}, headers={"X-Request-ID": "marker"})
    wait_for_audit(db, request_id="marker")
    assert audit_rows(db, request_id="not-audited") == []
    assert len(audit_rows(db)) == before + 1
