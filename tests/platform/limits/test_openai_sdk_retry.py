"""The official openai SDK backs off on our 429s and succeeds: it waits for the retry-after-ms the
bucket computed, then retries. Limits here refill over a 2-second window, so the wait is short."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from limits_live import LimitsServer, serve_limits

from loraloom.platform.limits.policy import Limits

WINDOW_S = 2.0


@pytest.fixture(scope="module")
def fast_window_server(model_dir, tmp_path_factory) -> Iterator[LimitsServer]:
    yield from serve_limits(model_dir, tmp_path_factory.mktemp("fast-window"), rate_limit_window_s=WINDOW_S)


def test_the_sdk_retries_a_429_after_retry_after_and_succeeds(fast_window_server):
    _, key = fast_window_server.tenant_key(Limits(requests_per_minute=1))  # one request per window
    seen: list[httpx.Response] = []
    http = httpx.Client(event_hooks={"response": [seen.append]})
    client = openai.OpenAI(base_url=f"{fast_window_server.url}/v1", api_key=key, http_client=http, max_retries=5)
    # The first call empties the bucket; a second right after it finds it empty, unless the first took a
    # whole window (the server's first request warms it up): then try again.
    for _ in range(3):
        client.completions.create(model="base", prompt="Hello", max_tokens=1)
        seen.clear()
        completion = client.completions.create(model="base", prompt="Hello", max_tokens=1)
        if seen[0].status_code == 429:
            break
    statuses = [response.status_code for response in seen]
    assert statuses[0] == 429 and statuses[-1] == 200, statuses
    assert completion.choices[0].finish_reason == "length"
    refused = seen[0]
    retry_ms = int(refused.headers["retry-after-ms"])
    assert 0 < retry_ms <= WINDOW_S * 1000  # what the SDK waited for: under one window
    assert refused.headers["x-ratelimit-limit-requests"] == "1"
    assert "x-should-retry" not in refused.headers


def test_the_sdk_does_not_retry_a_spent_quota(fast_window_server):
    _, key = fast_window_server.tenant_key(Limits(monthly_tokens=1))
    seen: list[httpx.Response] = []
    http = httpx.Client(event_hooks={"response": [seen.append]})
    client = openai.OpenAI(base_url=f"{fast_window_server.url}/v1", api_key=key, http_client=http, max_retries=3)
    client.completions.create(model="base", prompt="Hello", max_tokens=1)  # used: more than the quota of 1
    seen.clear()
    with pytest.raises(openai.RateLimitError) as raised:
        client.completions.create(model="base", prompt="Hello", max_tokens=1)
    assert raised.value.code == "insufficient_quota"
    assert len(seen) == 1  # x-should-retry: false, so no retry however long the quota lasts
