"""Operations, against a live server on the bundled model: the docs pages load without a network,
streams carry the headers proxies need and keep-alive comments while the first token is slow,
and every generation request logs one structured line."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.local import LocalAdapterLookup


@dataclass
class Server:
    url: str
    key: str

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.key), timeout=120)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[Server]:
    # Far shorter than a first token takes (a forward pass), so streams here see keep-alive comments.
    settings = migrated_settings(tmp_path_factory.mktemp("data")).model_copy(update={"sse_keepalive_interval_s": 1e-3})
    key = make_key(settings, tenant="acme", role="developer")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64))
    lookup = LocalAdapterLookup({engine.model_name}, {}, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield Server(url=url, key=key)


# src="...", href="...", and the quoted URLs Swagger UI's inline script fetches (url: '/openapi.json').
REFERENCE = re.compile(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_only_same_origin_assets_that_are_served(server, page):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        html = http.get(page)
        assert html.status_code == 200
        references = REFERENCE.findall(html.text)
        assert any(ref.endswith(".js") for ref in references), references
        for reference in references:
            # Absolute paths on this server: no scheme, no host, no protocol-relative //cdn...
            assert reference.startswith("/") and not reference.startswith("//"), reference
            assert http.get(reference).status_code == 200, reference


def test_streams_are_uncached_unbuffered_and_kept_alive_until_the_first_token(server):
    body = {"model": "base", "messages": [{"role": "user", "content": "Hi " * 400}], "max_tokens": 4,
            "stream": True}
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        text = "".join(response.iter_text())
    before_first_event, _, rest = text.partition("data: ")
    assert before_first_event.startswith(": keep-alive\n\n")
    assert set(before_first_event.split("\n\n")) == {": keep-alive", ""}  # nothing but comments
    assert text.endswith("data: [DONE]\n\n")


def test_the_openai_client_reads_a_kept_alive_stream(server):
    chunks = list(server.openai().completions.create(model="base", prompt="Hi " * 400, max_tokens=4, stream=True,
                                                     temperature=0))
    assert sum(len(chunk.choices[0].text) for chunk in chunks if chunk.choices) > 0
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
