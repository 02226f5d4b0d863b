"""GET /v1/models and /v1/models/{id} with the official openai client against a live server with a
registry: the list holds what a tenant can call (base, names, aliases, versions on request), each
with its own row's creation time, and retrieve answers every listed id and nothing of another tenant."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import openai
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter
from sqlalchemy import update

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import Adapter, AdapterVersion, Alias
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

NAMES = ("adapter_config.json", "adapter_model.safetensors")
CHAT = [{"role": "user", "content": "Hi"}]


@dataclass
class Served:
    url: str
    base: str
    acme: str  # developer key
    globex: str  # another tenant's developer key

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)


def moment(year: int) -> datetime:
    return datetime(year, 1, 1, tzinfo=timezone.utc)


# The rows' times, set in the database so that each differs from every other and from the server start.
ADAPTER_CREATED = moment(2001)
VERSION_CREATED = {1: moment(2002), 2: moment(2003)}
PROD_MOVED = moment(2004)
LATEST_MOVED = moment(2005)


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("peft")
    peft_adapter = make_peft_adapter(model_dir, root / "one", rank=4, alpha=8, target_modules=["q_proj"], seed=31)
    other_peft_adapter = make_peft_adapter(model_dir, root / "two", rank=4, alpha=8, target_modules=["v_proj"], seed=32)
    settings = migrated_settings(tmp_path_factory.mktemp("server"))
    acme = make_key(settings, tenant="acme", role="developer")
    globex = make_key(settings, tenant="globex", role="developer")
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    local_copy = Path(shutil.copytree(peft_adapter, tmp_path_factory.mktemp("local") / "local-copy"))
    with serve_in_thread(compose_app(settings, engine, adapters={"local-copy": local_copy})) as url:
        with httpx.Client(base_url=url, headers=bearer(acme), timeout=120) as http:
            for directory in (peft_adapter, other_peft_adapter):
                files = [("files", (name, (directory / name).read_bytes())) for name in NAMES]
                assert http.post("/v1/adapters/pirate/versions", files=files).status_code == 201
            assert http.put("/v1/adapters/pirate/aliases/prod", json={"version": 1}).status_code == 200
        set_row_times(settings.database_url)
        yield Served(url=url, base=engine.model_name, acme=acme, globex=globex)


def set_row_times(database_url: str) -> None:
    db = create_db_engine(database_url)
    try:
        with create_session_factory(db)() as session, session.begin():
            session.execute(update(Adapter).values(created_at=ADAPTER_CREATED))
            for number, created in VERSION_CREATED.items():
                session.execute(update(AdapterVersion).where(AdapterVersion.number == number).values(created_at=created))
            session.execute(update(Alias).where(Alias.name == "prod").values(updated_at=PROD_MOVED))
            session.execute(update(Alias).where(Alias.name == "latest").values(updated_at=LATEST_MOVED))
    finally:
        db.dispose()


def test_list_holds_base_names_and_aliases_with_their_rows_times(served):
    models = served.client(served.acme).models.list().data
    # `pirate:latest` too: requests may spell the alias out, so the list shows it.
    assert [m.id for m in models] == ["base", served.base, "pirate", "pirate:latest", "pirate:prod", "local-copy"]
    created = {m.id: m.created for m in models}
    assert created["pirate"] == int(ADAPTER_CREATED.timestamp())
    assert created["pirate:latest"] == int(LATEST_MOVED.timestamp())
    assert created["pirate:prod"] == int(PROD_MOVED.timestamp())
    # Server-wide entries date from the server's start, which is none of the rows' times.
    assert created["base"] == created[served.base] == created["local-copy"] > int(LATEST_MOVED.timestamp())
    owners = {m.id: m.owned_by for m in models}
    assert owners == {"base": "loraloom", served.base: "loraloom", "pirate": "acme", "pirate:latest": "acme", "pirate:prod": "acme",
                      "local-copy": "loraloom"}
    assert [m.parent for m in models] == [None, None, served.base, served.base, served.base, served.base]
    # `base` is the served model under its alias: vLLM's root names what it is.
    assert [m.root for m in models] == [served.base, served.base, "pirate", "pirate:latest", "pirate:prod",
                                        "local-copy"]


def test_versions_are_listed_on_request(served):
    page = served.client(served.acme).models.list(extra_query={"include_versions": "true"})
    assert [(m.id, m.created) for m in page.data[2:]] == [
        ("pirate", int(ADAPTER_CREATED.timestamp())),
        ("pirate:latest", int(LATEST_MOVED.timestamp())),
        ("pirate:prod", int(PROD_MOVED.timestamp())),
        ("pirate@1", int(VERSION_CREATED[1].timestamp())),
        ("pirate@2", int(VERSION_CREATED[2].timestamp())),
        ("local-copy", page.data[0].created),
    ]


def test_every_listed_id_is_retrieved_as_listed_and_answers_a_request(served):
    client = served.client(served.acme)
    listed = client.models.list(extra_query={"include_versions": "true"}).data
    for model in listed:
        assert client.models.retrieve(model.id) == model
        reply = client.chat.completions.create(model=model.id, messages=CHAT, max_tokens=1)
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_base_is_retrieved_with_the_models_sampling_defaults(served):
    """The bundled model's generation_config.json carries its model card's sampling (written at import)."""
    base = served.client(served.acme).models.retrieve("base")
    assert (base.id, base.root, base.parent) == ("base", served.base, None)
    assert base.generation_defaults == {"temperature": 0.2, "top_p": 0.9}
    adapter = served.client(served.acme).models.retrieve("pirate")
    assert adapter.generation_defaults == base.generation_defaults  # an adapter samples as its base does


def test_retrieve_of_an_unlisted_id_is_model_not_found(served):
    client = served.client(served.acme)
    for missing in ("pirate@3", "pirate:staging", "ghost", "ghost@1", "pirate@0"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(missing)
        error = caught.value.body
        assert (error["code"], error["param"]) == ("model_not_found", "model")
        assert repr(missing) in error["message"]


def test_another_tenants_adapter_answers_like_a_missing_one(served):
    theirs = served.client(served.globex)
    listed = [m.id for m in theirs.models.list(extra_query={"include_versions": "true"}).data]
    assert listed == ["base", served.base, "local-copy"]
    for model_id in ("pirate", "pirate:prod", "pirate@1"):
        with pytest.raises(openai.NotFoundError) as hidden:
            theirs.models.retrieve(model_id)
        with pytest.raises(openai.NotFoundError) as missing:
            theirs.models.retrieve(model_id.replace("pirate", "never-was"))
        assert hidden.value.body == {
            **missing.value.body, "message": missing.value.body["message"].replace("never-was", "pirate")
        }
