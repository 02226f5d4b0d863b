"""A key revoked (or expiring) while its requests run ends them: a stream gets a last error event in
OpenAI's shape, a request not streaming a 401, and the engine's request is aborted (its KV blocks
freed). The gateway learns of it from the database, so a revocation written there by another
process (another gateway, `loraloom` commands) works the same as one through this gateway's API."""
from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from live_api import bearer, wait_until
from sqlalchemy import update

from loraloom.platform.accounts.keys import revoke_key
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import ApiKey, utcnow

MAX_TOKENS = 900  # far more than is generated before the revocation ends it
LONG = {"model": "base", "prompt": "Count to a thousand:", "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True}


def new_key(access_server, name: str) -> tuple[uuid.UUID, str]:
    """(id, plaintext) of a new developer key of acme, made through the API by acme's admin."""
    created = httpx.post(f"{access_server.url}/v1/keys", json={"name": name, "role": "developer"},
                         headers=bearer(access_server.keys["admin"]), timeout=60)
    assert created.status_code == 201, created.text
    return uuid.UUID(created.json()["id"]), created.json()["key"]


def in_another_process(access_server, change) -> None:
    """`change` committed through a connection of its own, as another gateway or a CLI would."""
    engine = create_db_engine(access_server.settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            change(session)
    finally:
        engine.dispose()


def engine_idle(access_server) -> bool:
    stats = access_server.engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_blocks_used == 0


def stream_until_error(access_server, key: str, end_it) -> tuple[dict, list[str]]:
    """Stream a long completion with `key`, call `end_it()` after its first event, and read on until the
    error event; returns it and the data lines that came after it."""
    with httpx.Client(base_url=access_server.url, timeout=120) as http:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}, headers=bearer(key)) as stream:
            assert stream.status_code == 200
            data = (line.removeprefix("data: ") for line in stream.iter_lines() if line.startswith("data: "))
            assert json.loads(next(data))["object"] == "text_completion"
            end_it()
            for event in data:
                if event != "[DONE]" and "error" in json.loads(event):
                    return json.loads(event)["error"], list(data)
    raise AssertionError("the stream ended without an error event")


@pytest.mark.timeout(300)
def test_revoking_a_key_through_the_api_ends_its_stream_with_an_error_event(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    tokens_before = access_server.engine.stats().generation_tokens_total
    key_id, key = new_key(access_server, "streamer")

    def revoke() -> None:
        revoked = httpx.delete(f"{access_server.url}/v1/keys/{key_id}", headers=bearer(access_server.keys["admin"]))
        assert revoked.status_code == 200, revoked.text

    error, after = stream_until_error(access_server, key, revoke)
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "api_key_revoked" and error["type"] == "invalid_request_error"
    assert after == []  # the error is the last event
    wait_until(lambda: engine_idle(access_server), "the aborted request to free its KV blocks")
    assert access_server.engine.stats().generation_tokens_total - tokens_before < MAX_TOKENS


@pytest.mark.timeout(300)
def test_a_key_expiring_mid_stream_ends_it_too(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    key_id, key = new_key(access_server, "expiring")

    def expire() -> None:
        in_another_process(access_server, lambda session: session.execute(
            update(ApiKey).where(ApiKey.id == key_id).values(expires_at=utcnow() - timedelta(seconds=1))))

    error, _ = stream_until_error(access_server, key, expire)
    assert error["code"] == "api_key_expired"
    wait_until(lambda: engine_idle(access_server), "the aborted request to free its KV blocks")


@pytest.mark.timeout(300)
def test_a_request_not_streaming_is_answered_401_when_its_key_is_revoked_elsewhere(access_server):
    wait_until(lambda: engine_idle(access_server), "earlier requests to end")
    key_id, key = new_key(access_server, "waiting")
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, f"{access_server.url}/v1/completions", json=LONG, headers=bearer(key),
                            timeout=300)
        wait_until(lambda: access_server.engine.stats().num_running == 1, "the request to run")
        in_another_process(access_server, lambda session: revoke_key(session, key_id=key_id, tenant_id=None))
        response = reply.result()
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "api_key_revoked"
    wait_until(lambda: engine_idle(access_server), "the aborted request to free its KV blocks")
