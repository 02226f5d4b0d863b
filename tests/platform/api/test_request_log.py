"""The request log, against a live server on the bundled model: one structured line per request
(request id echoed or made, tenant name and id, the adapter as written and as resolved, status, tokens,
time to first token, duration, how the generation ended; polling routes at DEBUG), written once a stream has ended, for failures too; the audit
log records the same request id; the engine logs each adapter load (from storage into host memory,
from there into a slot) and eviction, naming the adapter, its tenant scope, the slot, the source and
the duration."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread, wait_until
from lora_factory import make_peft_adapter
from sqlalchemy import select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import AuditLogEntry, Tenant
from loraloom.platform.log_format import JsonLogFormatter
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.settings import Settings

CHAT = [{"role": "user", "content": "Name a colour."}]


@dataclass
class LoggedServer:
    url: str
    settings: Settings
    keys: dict[str, str]
    adapter_keys: dict[str, str]  # adapter name -> the runtime key the engine serves it under
    adapter_dir: Path  # served as --adapter-dir: adapters put there later are cold on their first request

    def http(self, key: str = "dev") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.keys[key]), timeout=120)


@pytest.fixture(scope="module")
def logged(model_dir, tmp_path_factory) -> Iterator[LoggedServer]:
    adapters = {
        name: make_peft_adapter(model_dir, tmp_path_factory.mktemp("adapters") / name, rank=4, alpha=8,
                                target_modules=["q_proj"], seed=seed)
        for seed, name in enumerate(("alpha", "beta"))
    }
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    keys = {"dev": make_key(settings, tenant="acme", role="developer"),
            "admin": make_key(settings, tenant="acme", role="admin")}
    # One slot for two adapters: asking for both in turn loads one and evicts the other.
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64, max_loras=1))
    adapter_dir = tmp_path_factory.mktemp("adapter_dir")
    lookup = LocalAdapterLookup({engine.model_name}, adapters, adapter_dir)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield LoggedServer(url=url, settings=settings, keys=keys,
                           adapter_keys={name: lookup.resolve(name).key for name in adapters}, adapter_dir=adapter_dir)


@pytest.fixture
def request_log(caplog) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="loraloom.request")
    return caplog


def lines_for(caplog: pytest.LogCaptureFixture, request_id: str) -> list[dict]:
    """The request's log lines as the JSON formatter writes them (the server's stderr format)."""
    formatter = JsonLogFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records
            if record.name == "loraloom.request" and getattr(record, "request_id", None) == request_id]


def logged_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict:
    # The line is written once the response has ended, which the client may see a moment before.
    wait_until(lambda: lines_for(caplog, request_id), f"the log line of {request_id}")
    lines = lines_for(caplog, request_id)
    assert len(lines) == 1, lines
    return lines[0]


def tenant_id(settings: Settings, name: str) -> str:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            return str(session.scalar(select(Tenant.id).where(Tenant.name == name)))
    finally:
        engine.dispose()


def test_a_completion_is_logged_with_the_client_s_request_id_tenant_adapter_and_tokens(logged, request_log):
    body = {"model": "base", "adapter_id": "alpha", "messages": CHAT, "max_tokens": 5, "temperature": 0}
    with logged.http() as http:
        response = http.post("/v1/chat/completions", json=body, headers={"X-Request-ID": "client-trace-42"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "client-trace-42"
    line = logged_line(request_log, "client-trace-42")
    usage = response.json()["usage"]
    assert line["level"] == "INFO" and line["logger"] == "loraloom.request"
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/chat/completions", 200)
    assert (line["tenant"], line["tenant_id"]) == ("acme", tenant_id(logged.settings, "acme"))
    assert line["adapter"] == "alpha"  # as the request wrote it: adapter_id, not the runtime key
    assert line["adapter_resolved"] == "alpha"  # a server-local adapter serves under its name
    assert line["route"] == "/v1/chat/completions"
    assert line["completion_id"] == response.json()["id"]
    assert line["outcome"] == "ok"
    assert (line["prompt_tokens"], line["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert 0 < line["time_to_first_token_ms"] <= line["duration_ms"]


def test_a_request_without_a_usable_id_gets_one_made_and_returned(logged, request_log):
    with logged.http() as http:
        made = http.get("/v1/models")
        replaced = http.get("/v1/models", headers={"X-Request-ID": "has spaces and\ttabs"})
    for response in (made, replaced):
        request_id = response.headers["x-request-id"]
        assert request_id.startswith("req-") and len(request_id) <= 64
        line = logged_line(request_log, request_id)
        assert (line["path"], line["status"]) == ("/v1/models", 200)
        assert "adapter" not in line  # no generation: no generation fields
    assert made.headers["x-request-id"] != replaced.headers["x-request-id"]


def test_a_stream_is_logged_once_after_it_ends_with_the_whole_stream_s_tokens(logged, request_log):
    body = {"model": "beta", "prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with logged.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: {")]
    usage = json.loads(events[-1])["usage"]
    line = logged_line(request_log, request_id)
    assert line["status"] == 200 and line["adapter"] == "beta" and line["outcome"] == "ok"
    assert (line["prompt_tokens"], line["completion_tokens"]) == (usage["prompt_tokens"], 12)
    assert line["time_to_first_token_ms"] <= line["duration_ms"]


def test_failing_requests_are_logged_with_their_status(logged, request_log):
    with logged.http() as http:
        missing = http.post("/v1/completions", json={"model": "no-such-adapter:prod", "prompt": "Hi", "max_tokens": 2},
                            headers={"X-Request-ID": "missing-1"})
    unauthenticated = httpx.get(f"{logged.url}/v1/models", headers={"X-Request-ID": "anonymous-1"})
    assert (missing.status_code, unauthenticated.status_code) == (404, 401)
    line = logged_line(request_log, "missing-1")
    assert line["status"] == 404 and line["adapter"] == "no-such-adapter:prod"
    assert (line["completion_tokens"], line["time_to_first_token_ms"]) == (0, None)
    line = logged_line(request_log, "anonymous-1")
    assert line["status"] == 401 and line["tenant"] is None and line["tenant_id"] is None


def test_polling_is_logged_at_debug_and_other_reads_at_info(logged, request_log):
    with logged.http() as http:
        polled = http.get("/v1/engine/status", headers={"X-Request-ID": "poll-1"})
        job = http.get("/v1/fine_tuning/jobs/ftjob-none", headers={"X-Request-ID": "poll-2"})
        listed = http.get("/v1/models", headers={"X-Request-ID": "read-1"})
    assert (polled.status_code, job.status_code, listed.status_code) == (200, 404, 200)
    assert logged_line(request_log, "read-1")["level"] == "INFO"
    assert not lines_for(request_log, "poll-1") and not lines_for(request_log, "poll-2")  # not at INFO
    request_log.set_level(logging.DEBUG, logger="loraloom.request")
    with logged.http() as http:
        assert http.get("/v1/fine_tuning/jobs/ftjob-none/events", headers={"X-Request-ID": "poll-3"}).status_code == 404
    line = logged_line(request_log, "poll-3")
    assert (line["level"], line["route"]) == ("DEBUG", "/v1/fine_tuning/jobs/{job_id}/events")


def test_the_audit_log_records_the_request_id_the_response_returned(logged):
    with logged.http("admin") as http:
        created = http.post("/v1/keys", json={"name": "audited", "role": "inference"})
    assert created.status_code == 201
    request_id = created.headers["x-request-id"]
    engine = create_db_engine(logged.settings.database_url)
    try:
        factory = create_session_factory(engine)

        def audited() -> list[str | None]:
            with factory() as session:
                return list(session.scalars(select(AuditLogEntry.request_id)
                                            .where(AuditLogEntry.resource_id == created.json()["id"])))

        wait_until(audited, "the audit row")
        assert audited() == [request_id]
    finally:
        engine.dispose()


def test_adapter_loads_and_evictions_are_logged_with_the_adapter_and_slot(logged, caplog):
    caplog.set_level(logging.INFO, logger="loraloom.engine")
    with logged.http() as http:
        for name in ("alpha", "beta", "alpha"):  # one slot: each switch loads one adapter over the other
            body = {"model": name, "prompt": "Hi", "max_tokens": 1}
            assert http.post("/v1/completions", json=body).status_code == 200
    loads = [(record.adapter_name, record.adapter_key, record.slot) for record in caplog.records
             if record.name == "loraloom.engine.llm_engine" and hasattr(record, "slot")]
    evictions = [(record.adapter_key, record.slot, record.replaced_by) for record in caplog.records
                 if record.name == "loraloom.engine.lora.slots"]
    alpha, beta = logged.adapter_keys["alpha"], logged.adapter_keys["beta"]
    assert loads[-2:] == [("beta", beta, 0), ("alpha", alpha, 0)]
    assert evictions[-2:] == [(alpha, 0, beta), (beta, 0, alpha)]


def test_a_cold_adapter_s_loads_are_logged_with_source_tenant_and_duration(logged, model_dir, caplog):
    caplog.set_level(logging.INFO, logger="loraloom.engine")
    # New in --adapter-dir, so not preloaded at start: its first request fetches it from storage.
    make_peft_adapter(model_dir, logged.adapter_dir / "gamma", rank=4, alpha=8, target_modules=["q_proj"], seed=7)
    with logged.http() as http:
        for name in ("alpha", "gamma"):  # alpha first, so that gamma's load evicts it from the one slot
            assert http.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 1}).status_code == 200
    host_loads = [record for record in caplog.records
                  if record.name == "loraloom.engine.lora.host_cache" and getattr(record, "adapter_name", None) == "gamma"]
    slot_loads = [record for record in caplog.records
                  if record.name == "loraloom.engine.llm_engine" and getattr(record, "adapter_name", None) == "gamma"]
    assert len(host_loads) == len(slot_loads) == 1  # one fetch from storage, one copy into the one slot
    host, slot = host_loads[0], slot_loads[0]
    gamma = host.adapter_key
    scope = gamma.split("/")[0]
    assert scope == "server"  # adapters served by the server belong to no tenant
    assert (host.tenant, host.source) == (scope, "storage")
    assert host.bytes > 0 and host.duration_ms > 0
    assert (slot.adapter_key, slot.tenant, slot.source, slot.slot) == (gamma, scope, "host_cache", 0)
    assert slot.duration_ms >= 0
    (eviction,) = [record for record in caplog.records
                   if record.name == "loraloom.engine.lora.slots" and record.replaced_by == gamma]
    assert (eviction.adapter_key, eviction.tenant, eviction.slot) == (logged.adapter_keys["alpha"], scope, 0)
