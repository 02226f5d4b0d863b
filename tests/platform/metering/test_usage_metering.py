"""Usage metering through a live server: each chat / completion request (plain, streamed, with
an adapter, refused by the engine, abandoned by its client) leaves one usage row that
matches what the response reported, and GET /v1/usage sums them per adapter, key and day."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread, wait_until
from lora_factory import make_peft_adapter
from sqlalchemy import select

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.api_keys import hash_api_key
from loraloom.platform.db.models import ApiKey, UsageRecord, UsageStatus, utcnow
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.settings import Settings

CHAT = [{"role": "user", "content": "Name a colour."}]
COUNTING_PROMPT = "1, 2, 3, 4,"


@dataclass
class MeteredServer:
    url: str
    settings: Settings
    keys: dict[str, str]
    alpha_key: str  # the runtime adapter key the engine serves "alpha" under

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[key], max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def metered(model_dir, tmp_path_factory) -> Iterator[MeteredServer]:
    alpha = make_peft_adapter(
        model_dir, tmp_path_factory.mktemp("adapters") / "alpha", rank=4, alpha=8, target_modules=["q_proj"], seed=5
    )
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    keys = {
        "dev": make_key(settings, tenant="acme", role="developer"),
        "app": make_key(settings, tenant="acme", role="inference"),
        "other": make_key(settings, tenant="umbrella", role="developer"),
        "admin": make_key(settings, tenant="default", role="admin"),
    }
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64))
    lookup = LocalAdapterLookup({engine.model_name}, {"alpha": alpha}, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield MeteredServer(url=url, settings=settings, keys=keys, alpha_key=lookup.resolve("alpha").key)


def usage_rows(settings: Settings) -> list[UsageRecord]:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            return list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))
    finally:
        engine.dispose()


def key_id(settings: Settings, plaintext: str):
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            return session.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_api_key(plaintext)))
    finally:
        engine.dispose()


def test_each_request_is_metered_and_aggregated(metered):
    dev, app = metered.client("dev"), metered.client("app")
    replies = {}  # request id -> (key, adapter key, status, prompt tokens, completion tokens)

    for _ in range(2):
        reply = dev.chat.completions.create(model="base", messages=CHAT, max_tokens=3, temperature=0)
        replies[reply.id] = ("dev", None, "ok", reply.usage.prompt_tokens, reply.usage.completion_tokens)
    reply = app.completions.create(model="alpha", prompt="Hello", max_tokens=4, temperature=0)
    replies[reply.id] = ("app", metered.alpha_key, "ok", reply.usage.prompt_tokens, reply.usage.completion_tokens)
    *_, last = app.chat.completions.create(
        model="base", messages=CHAT, max_tokens=2, temperature=0, extra_body={"adapter_id": "alpha"},
        stream=True, stream_options={"include_usage": True},
    )
    replies[last.id] = ("app", metered.alpha_key, "ok", last.usage.prompt_tokens, last.usage.completion_tokens)

    # Refused by the engine (prompt longer than the context): metered as an error, no tokens generated.
    with pytest.raises(openai.BadRequestError):
        dev.completions.create(model="base", prompt=[1] * 100_000, max_tokens=1)
    # Abandoned by its client after the first chunk: metered as aborted, with what was generated.
    body = {"model": "base", "prompt": COUNTING_PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{metered.url}/v1/completions", json=body, headers=bearer(metered.keys["dev"])) as r:
        first = json.loads(next(line for line in r.iter_lines() if line.startswith("data: ")).removeprefix("data: "))
    # Another tenant's request: never in acme's totals.
    metered.client("other").completions.create(model="base", prompt="Hi", max_tokens=1)

    wait_until(lambda: len(usage_rows(metered.settings)) == len(replies) + 3, "every request's usage row")
    rows = {row.request_id: row for row in usage_rows(metered.settings)}
    key_ids = {name: key_id(metered.settings, metered.keys[name]) for name in metered.keys}

    for request_id, (key, adapter_key, status, prompt_tokens, completion_tokens) in replies.items():
        row = rows[request_id]
        assert (row.api_key_id, row.adapter_key, row.status.value) == (key_ids[key], adapter_key, status)
        assert (row.prompt_tokens, row.completion_tokens) == (prompt_tokens, completion_tokens)
        assert 0 < row.time_to_first_token_ms <= row.duration_ms
    assert rows[last.id].endpoint == "chat.completions" and rows[last.id].model == "base"

    refused = [row for row in rows.values() if row.status is UsageStatus.error]
    assert len(refused) == 1 and refused[0].completion_tokens == 0 and refused[0].time_to_first_token_ms is None
    aborted = rows[first["id"]]
    assert aborted.status is UsageStatus.aborted and 0 < aborted.completion_tokens < 300
    assert {row.tenant_id for row in rows.values() if row.api_key_id == key_ids["other"]} != {rows[last.id].tenant_id}

    acme_rows = [row for row in rows.values() if row.api_key_id in (key_ids["dev"], key_ids["app"])]
    with httpx.Client(base_url=metered.url, timeout=60, headers=bearer(metered.keys["dev"])) as http:
        by_adapter = http.get("/v1/usage", params={"group_by": "adapter"}).json()
        assert by_adapter["tenant"] == "acme"
        buckets = {bucket["adapter"]: bucket for bucket in by_adapter["data"]}
        assert set(buckets) == {"base", "alpha"}  # the names users know, never the runtime key
        for adapter, bucket in buckets.items():
            mine = [row for row in acme_rows if (row.adapter_name or "base") == adapter]
            assert bucket["requests"] == len(mine)
            assert bucket["prompt_tokens"] == sum(row.prompt_tokens for row in mine)
            assert bucket["completion_tokens"] == sum(row.completion_tokens for row in mine)
            assert bucket["total_tokens"] == bucket["prompt_tokens"] + bucket["completion_tokens"]
            assert bucket["errors"] == sum(row.status is UsageStatus.error for row in mine)
            assert bucket["aborted"] == sum(row.status is UsageStatus.aborted for row in mine)

        by_key = {b["api_key_id"]: b for b in http.get("/v1/usage", params={"group_by": "key"}).json()["data"]}
        assert set(by_key) == {str(key_ids["dev"]), str(key_ids["app"])}
        assert by_key[str(key_ids["app"])]["requests"] == 2
        assert by_key[str(key_ids["dev"])]["api_key_prefix"] == metered.keys["dev"][:11]

        by_day = http.get("/v1/usage", params={"group_by": "day"}).json()["data"]
        assert [bucket["day"] for bucket in by_day] == [utcnow().date().isoformat()]
        assert by_day[0]["requests"] == len(acme_rows)

        tomorrow = http.get("/v1/usage", params={"start": "2999-01-01"}).json()
        assert tomorrow["data"] == [] and tomorrow["start"].startswith("2999-01-01T00:00:00")
        backwards = http.get("/v1/usage", params={"start": "2026-01-02", "end": "2026-01-01"})
        assert backwards.status_code == 400 and backwards.json()["error"]["param"] == "end"
        assert http.get("/v1/usage", params={"group_by": "model"}).status_code == 400

    admin = httpx.get(f"{metered.url}/v1/usage", params={"group_by": "day", "tenant": "acme"},
                      headers=bearer(metered.keys["admin"]), timeout=60).json()
    assert admin["data"] == by_day
