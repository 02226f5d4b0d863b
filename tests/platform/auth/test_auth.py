"""Bearer-key authentication on every /v1 route of a live server: 401 for a missing, malformed,
unknown, revoked or expired key, 403 for the wrong role, all in OpenAI's error shape."""
from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from live_api import bearer, make_key, wait_until
from sqlalchemy import update

from loraloom.platform.accounts.keys import KeyUse, revoke_key, write_key_uses
from loraloom.platform.api.app import check_api_routes_authenticated
from loraloom.platform.api.deps import authenticate
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.api_keys import hash_api_key
from loraloom.platform.db.models import ApiKey, utcnow

OPEN_PATHS = ("/health", "/openapi.json")
# Outside /v1, what takes a key: the metrics, the operator's (docs/ACCESS.md).
KEYED_PATHS = ("/metrics",)


def assert_openai_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error"
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
    return error["message"]


def api_routes(url: str) -> list[tuple[str, str]]:
    """(method, path) of every /v1 operation the server documents, path parameters filled in."""
    document = httpx.get(f"{url}/openapi.json").json()
    routes = []
    for path, operations in document["paths"].items():
        if path.startswith("/v1/"):
            concrete = re.sub(r"\{[^}]+\}", "1", path)
            routes.extend((method.upper(), concrete) for method in operations)
    return routes


def with_db(settings, action):
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            return action(session)
    finally:
        engine.dispose()


def key_row(settings, plaintext: str) -> ApiKey:
    return with_db(settings, lambda s: s.query(ApiKey).filter_by(key_hash=hash_api_key(plaintext)).one())


@pytest.fixture(scope="module")
def dead_keys(auth_server) -> dict[str, str]:
    """A revoked and an expired key of tenant acme."""
    settings = auth_server.settings
    revoked = make_key(settings, tenant="acme", role="admin", name="revoked")
    expired = make_key(settings, tenant="acme", role="admin", name="expired")
    with_db(settings, lambda s: revoke_key(s, key_id=key_row(settings, revoked).id, tenant_id=None))
    with_db(
        settings,
        lambda s: s.execute(
            update(ApiKey).where(ApiKey.name == "expired").values(expires_at=utcnow() - timedelta(seconds=1))
        ),
    )
    return {"revoked": revoked, "expired": expired}


def test_every_api_route_is_documented_and_covered(auth_server):
    paths = {path for _, path in api_routes(auth_server.url)}
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/tenants", "/v1/keys",
                 "/v1/keys/1", "/v1/usage"):
        assert path in paths


@pytest.mark.parametrize(
    ("authorization", "code", "message_part"),
    [
        (None, "missing_api_key", "Missing API key"),
        ("", "missing_api_key", "Missing API key"),
        ("Basic dXNlcjpwYXNz", "invalid_authorization_header", "Bearer <key>"),
        ("Bearer", "invalid_authorization_header", "Bearer <key>"),
        ("Bearer two keys", "invalid_authorization_header", "Bearer <key>"),
        ("Bearer ll-not-a-key-anyone-made", "invalid_api_key", "Incorrect API key"),
    ],
)
def test_bad_credentials_are_401_on_every_api_route(auth_server, authorization, code, message_part):
    headers = {} if authorization is None else {"Authorization": authorization}
    with httpx.Client(base_url=auth_server.url, timeout=60) as http:
        for method, path in api_routes(auth_server.url):
            message = assert_openai_error(http.request(method, path, headers=headers), 401, code)
            assert message_part in message, (method, path)
            presented = (authorization or "").partition(" ")[2]
            if presented:
                assert presented not in message  # what the client sent as its key is never echoed


@pytest.mark.parametrize("kind", ["revoked", "expired"])
def test_revoked_and_expired_keys_are_401_on_every_api_route(auth_server, dead_keys, kind):
    key = dead_keys[kind]
    prefix = key_row(auth_server.settings, key).prefix
    with httpx.Client(base_url=auth_server.url, timeout=60, headers=bearer(key)) as http:
        for method, path in api_routes(auth_server.url):
            message = assert_openai_error(http.request(method, path), 401, f"api_key_{kind}")
            assert kind in message and prefix in message and key not in message


def test_scheme_is_case_insensitive_and_valid_keys_reach_the_routes(auth_server):
    key = auth_server.keys["inference"]
    with httpx.Client(base_url=auth_server.url, timeout=60) as http:
        assert http.get("/v1/models", headers={"Authorization": f"bearer {key}"}).status_code == 200
        reply = http.post(
            "/v1/completions", headers=bearer(key), json={"model": "base", "prompt": "Hi", "max_tokens": 1}
        )
        assert reply.status_code == 200, reply.text
        chat = http.post(
            "/v1/chat/completions",
            headers=bearer(key),
            json={"model": "base", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        )
        assert chat.status_code == 200, chat.text
        assert http.get("/v1/tenants", headers=bearer(auth_server.keys["admin"])).status_code == 200


@pytest.mark.parametrize(
    ("role", "method", "path", "needed"),
    [
        ("inference", "POST", "/v1/tenants", "'admin'"),
        ("developer", "POST", "/v1/tenants", "'admin'"),
        ("developer", "GET", "/v1/tenants", "'admin'"),
        ("inference", "POST", "/v1/keys", "'admin'"),
        ("developer", "POST", "/v1/keys", "'admin'"),
        ("developer", "DELETE", f"/v1/keys/{uuid.uuid4()}", "'admin'"),
        ("inference", "GET", "/v1/keys", "'admin' or 'developer'"),
        ("inference", "GET", "/v1/usage", "'admin' or 'developer'"),
    ],
)
def test_wrong_role_is_403_naming_the_needed_role(auth_server, role, method, path, needed):
    response = httpx.request(method, f"{auth_server.url}{path}", headers=bearer(auth_server.keys[role]), timeout=60)
    message = assert_openai_error(response, 403, "insufficient_role")
    assert needed in message and repr(role) in message


def test_health_and_openapi_need_no_key(auth_server):
    for path in OPEN_PATHS:
        assert httpx.get(f"{auth_server.url}{path}", timeout=60).status_code == 200, path


def test_openapi_documents_bearer_auth_and_401_on_api_routes(auth_server):
    document = httpx.get(f"{auth_server.url}/openapi.json", timeout=60).json()
    assert any(scheme["scheme"] == "bearer" for scheme in document["components"]["securitySchemes"].values())
    for path, operations in document["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1/") or path in KEYED_PATHS:
                assert operation["security"] and "401" in operation["responses"], path
            else:
                assert "security" not in operation, path


def test_an_unauthenticated_api_route_is_refused_when_the_app_is_built():
    app = FastAPI()
    open_router = APIRouter()

    @open_router.get("/v1/leaky")
    def leaky() -> None: ...

    app.include_router(open_router)
    with pytest.raises(RuntimeError, match="/v1/leaky is served without authentication"):
        check_api_routes_authenticated(app)

    guarded = FastAPI()
    guarded.include_router(open_router, dependencies=[Depends(authenticate)])
    check_api_routes_authenticated(guarded)


def test_last_used_is_recorded_off_the_request_path(auth_server):
    settings = auth_server.settings
    key = make_key(settings, tenant="acme", role="inference", name="fresh")
    assert key_row(settings, key).last_used_at is None
    before = utcnow()
    assert httpx.get(f"{auth_server.url}/v1/models", headers=bearer(key), timeout=60).status_code == 200
    wait_until(lambda: key_row(settings, key).last_used_at is not None, "last_used_at to be written")
    assert before <= key_row(settings, key).last_used_at <= utcnow()


def test_key_uses_only_move_last_used_forward(auth_server):
    settings = auth_server.settings
    key_id = key_row(settings, make_key(settings, tenant="acme", role="inference", name="ordering")).id
    now = utcnow()
    engine = create_db_engine(settings.database_url)
    try:
        factory = create_session_factory(engine)
        # Two batches landing out of order, the first with repeated uses: the latest use wins.
        write_key_uses(factory, [KeyUse(key_id, now - timedelta(minutes=5)), KeyUse(key_id, now)])
        write_key_uses(factory, [KeyUse(key_id, now - timedelta(minutes=9))])
        with factory() as session:
            assert session.get(ApiKey, key_id).last_used_at == now
    finally:
        engine.dispose()


def test_keys_are_stored_only_as_hashes(auth_server):
    """No plaintext key anywhere in the database files (SQLite: the file and its write-ahead log)."""
    database = Path(auth_server.settings.database_url.removeprefix("sqlite:///"))
    stored = b"".join(path.read_bytes() for path in database.parent.glob(database.name + "*"))
    assert len(stored) > 0
    for key in auth_server.keys.values():
        assert key.encode() not in stored
        assert hash_api_key(key).encode() in stored
