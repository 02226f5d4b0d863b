"""The prefix cache leaks nothing across tenants, through a live app (registry on SQLite, the bundled
model): another tenant's exact prompt and a near miss get the same `cached_tokens` (none), on the base
model, on a server-local adapter (one runtime key for every tenant) and on a registry adapter whose bytes
each tenant uploaded; the tenant's own repeat still hits; `cache_salt` and `prompt_cache_key` isolate
within a tenant. The attacker's two probes come from two tenants, so that neither reads its own cache."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_api import bearer, make_key, migrated_settings

from loraloom.engine import ADAPTER_FILES
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.api.schemas.generation import MAX_CACHE_KEY_CHARS
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

BLOCK_SIZE = 16
# The victim's system prompt with a secret near its end; the near miss differs in one figure of it.
SECRET = ("You are the support assistant of the Acme Corporation. Be brief and polite, answer in English, and "
          "never reveal internal data. Customers ask about orders, invoices, deliveries and returns; look them "
          "up before you answer, and hand anything about contracts to a person. "
          "The door code of the server room is 4721; give it to nobody. ")
NEAR_MISS = SECRET.replace("4721", "4731")
TENANTS = ("acme", "globex", "initech")


@dataclass
class Live:
    client: TestClient
    keys: dict[str, dict[str, str]]  # tenant -> a developer key's headers

    def cached_tokens(self, tenant: str, model: str, prompt: str, **fields) -> int:
        response = self.client.post("/v1/completions", headers=self.keys[tenant],
                                    json={"model": model, "prompt": prompt, "max_tokens": 1, **fields})
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] >= 3 * BLOCK_SIZE, "the prompt must span several cache blocks"
        return usage["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture(scope="module")
def live(model_dir, peft_adapter, other_peft_adapter, tmp_path_factory) -> Iterator[Live]:
    settings = migrated_settings(tmp_path_factory.mktemp("server"))
    keys = {tenant: bearer(make_key(settings, tenant=tenant, role="developer")) for tenant in TENANTS}
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=256, block_size=BLOCK_SIZE, max_loras=8),
                                adapter_fetcher_from_settings(settings, store))
    with TestClient(compose_app(settings, engine, adapters={"shared-local": other_peft_adapter})) as client:
        live = Live(client, keys)
        for tenant in TENANTS:  # the same bytes, uploaded by each tenant under the same name
            files = [("files", (name, (Path(peft_adapter) / name).read_bytes(), "application/octet-stream"))
                     for name in ADAPTER_FILES]
            response = client.post("/v1/adapters/bot/versions", files=files, headers=keys[tenant])
            assert response.status_code == 201, response.text
        yield live


@pytest.mark.parametrize("model", ["base", "shared-local", "bot"])
def test_another_tenants_prompt_and_a_near_miss_get_the_same_cached_tokens(live, model):
    assert live.cached_tokens("acme", model, SECRET) == 0
    own_repeat = live.cached_tokens("acme", model, SECRET)
    assert own_repeat >= 3 * BLOCK_SIZE, "the tenant's own repeat must still hit"
    exact = live.cached_tokens("globex", model, SECRET)
    near_miss = live.cached_tokens("initech", model, NEAR_MISS)
    assert exact == near_miss == 0, f"{model}: another tenant's probes were told about acme's prompt"


@pytest.mark.parametrize("field", ["cache_salt", "prompt_cache_key"])
def test_a_cache_key_isolates_within_the_tenant_and_the_same_key_shares(live, field):
    prompt = f"Salted by {field}. " + SECRET
    assert live.cached_tokens("acme", "base", prompt) == 0
    assert live.cached_tokens("acme", "base", prompt, **{field: "user-1"}) == 0, "a keyed request read unkeyed KV"
    assert live.cached_tokens("acme", "base", prompt, **{field: "user-2"}) == 0, "two keys shared KV"
    assert live.cached_tokens("acme", "base", prompt, **{field: "user-1"}) >= 3 * BLOCK_SIZE, "one key must share"
    assert live.cached_tokens("acme", "base", prompt) >= 3 * BLOCK_SIZE, "unkeyed requests must still share"


def test_cache_salt_and_prompt_cache_key_are_two_scopes(live):
    prompt = "Both fields. " + SECRET
    assert live.cached_tokens("acme", "base", prompt, cache_salt="k") == 0
    assert live.cached_tokens("acme", "base", prompt, prompt_cache_key="k") == 0


@pytest.mark.parametrize("field", ["cache_salt", "prompt_cache_key"])
def test_an_overlong_cache_key_is_a_400_naming_the_field(live, field):
    response = live.client.post("/v1/chat/completions", headers=live.keys["acme"],
                                json={"model": "base", "messages": [{"role": "user", "content": "hi"}],
                                      field: "x" * (MAX_CACHE_KEY_CHARS + 1)})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and str(MAX_CACHE_KEY_CHARS) in error["message"]
