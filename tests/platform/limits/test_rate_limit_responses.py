"""429s and the x-ratelimit-* headers on a live API: requests, tokens and concurrency limits, of a
tenant and of a key, the true-up of a token charge, and the monthly quota."""
from __future__ import annotations

import threading

import httpx
import pytest
from limits_live import long_stream
from live_api import bearer, wait_until

from loraloom.platform.limits.policy import Limits

PROMPT = "The capital of France is"


def complete(server, key: str, max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", headers=bearer(key), timeout=120,
                      json={"model": "base", "prompt": PROMPT, "max_tokens": max_tokens, **extra})


def prompt_tokens(server) -> int:
    return len(server.app.state.engine.tokenizer.encode(PROMPT, add_special_tokens=True))


def assert_openai_429(response: httpx.Response, *, error_type: str, code: str = "rate_limit_exceeded") -> dict:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == error_type and error["code"] == code and error["param"] is None
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_normal_response_carries_the_ratelimit_headers(limits_server):
    _, key = limits_server.tenant_key(Limits(requests_per_minute=10, tokens_per_minute=1000))
    response = complete(limits_server, key, max_tokens=4, ignore_eos=True)
    assert response.status_code == 200, response.text
    headers = response.headers
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-reset-requests"] == "6s"  # one request of 10 per minute refills in 6 s
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    # At admission the request was charged its prompt and every token it may generate.
    assert headers["x-ratelimit-remaining-tokens"] == str(1000 - prompt_tokens(limits_server) - 4)


def test_unlimited_callers_get_no_ratelimit_headers(limits_server):
    _, key = limits_server.tenant_key()
    response = complete(limits_server, key)
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("x-ratelimit")]


def test_requests_per_minute_of_a_key(limits_server):
    _, key = limits_server.tenant_key(key_limits=Limits(requests_per_minute=2))
    assert complete(limits_server, key).status_code == 200
    assert complete(limits_server, key).status_code == 200
    response = complete(limits_server, key)
    error = assert_openai_429(response, error_type="requests")
    assert "requests per minute" in error["message"] and "this API key" in error["message"]
    # Two per minute: one request refills in 30 s, less the time since the first was charged.
    retry_ms = int(response.headers["retry-after-ms"])
    assert 0 < retry_ms <= 30_000 and int(response.headers["retry-after"]) == -(-retry_ms // 1000)
    assert response.headers["x-ratelimit-remaining-requests"] == "0"


def test_tokens_per_minute_of_a_tenant_are_trued_up_to_what_was_used(limits_server):
    prompt = prompt_tokens(limits_server)
    # Room for one request asking 40 tokens, not for two: unless the first gives back what it did not use.
    capacity = prompt + 40 + prompt + 20
    _, key = limits_server.tenant_key(Limits(tokens_per_minute=capacity))
    first = complete(limits_server, key, max_tokens=40, stop=[" "])  # stops long before 40 tokens
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["total_tokens"]
    assert used < prompt + 40
    second = complete(limits_server, key, max_tokens=40 + (prompt + 40 - used) // 2)
    assert second.status_code == 200, second.text  # fits only with the first one's refund
    third = complete(limits_server, key, max_tokens=capacity)
    error = assert_openai_429(third, error_type="tokens")
    assert "Request too large" in error["message"] and third.headers["x-should-retry"] == "false"


def test_a_streamed_request_is_trued_up_too(limits_server):
    prompt = prompt_tokens(limits_server)
    _, key = limits_server.tenant_key(Limits(tokens_per_minute=prompt + 50))
    with httpx.stream("POST", f"{limits_server.url}/v1/completions", headers=bearer(key), timeout=120,
                      json={"model": "base", "prompt": PROMPT, "max_tokens": 50, "stream": True,
                            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["x-ratelimit-remaining-tokens"] == "0"
        body = "".join(response.iter_text())
    assert body.rstrip().endswith("data: [DONE]")
    # The stream gave back what it did not generate, so a request of its prompt and one token fits again
    # only if it generated fewer than 50 tokens; and the tokens it did generate are charged.
    me = httpx.get(f"{limits_server.url}/v1/me", headers=bearer(key)).json()
    left = me["limits"]["remaining"]["tenant"]["tokens"]["remaining"]
    assert left > 0 or "length" in body


def test_too_many_tokens_for_the_window_wait_for_the_bucket(limits_server):
    prompt = prompt_tokens(limits_server)
    _, key = limits_server.tenant_key(Limits(tokens_per_minute=2 * prompt + 8))
    assert complete(limits_server, key, max_tokens=4, ignore_eos=True).status_code == 200
    assert complete(limits_server, key, max_tokens=4, ignore_eos=True).status_code == 200
    response = complete(limits_server, key, max_tokens=4, ignore_eos=True)
    assert_openai_429(response, error_type="tokens")
    assert int(response.headers["retry-after"]) >= 1 and "x-should-retry" not in response.headers


def test_concurrent_requests_of_a_tenant(limits_server):
    _, key = limits_server.tenant_key(Limits(max_concurrent_requests=1))
    with long_stream(limits_server, key):
        refused = complete(limits_server, key)
        error = assert_openai_429(refused, error_type="concurrent_requests")
        assert "concurrent requests" in error["message"] and "this tenant" in error["message"]
        assert refused.headers["retry-after"] == "1" and refused.headers["retry-after-ms"] == "1000"
    # The client left mid-stream: its slot is free again.
    assert complete(limits_server, key).status_code == 200
    # And a request refused after admission (a schema the engine cannot compile) frees its slot as well.
    bad = complete(limits_server, key, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert bad.status_code == 400
    assert complete(limits_server, key).status_code == 200


def test_concurrent_requests_of_a_key(limits_server):
    _, key = limits_server.tenant_key(key_limits=Limits(max_concurrent_requests=1))
    with long_stream(limits_server, key):
        error = assert_openai_429(complete(limits_server, key), error_type="concurrent_requests")
        assert "this API key" in error["message"]


def test_a_full_server_answers_503_with_retry_after(limits_server):
    _, key = limits_server.tenant_key()
    engine = limits_server.app.state.engine
    with long_stream(limits_server, key):
        # The engine runs one request at a time: a second one waits, and the server is then full.
        waiting = threading.Thread(target=complete, args=(limits_server, key), kwargs={"max_tokens": 1})
        waiting.start()
        wait_until(lambda: engine.stats().num_waiting == 1, "a request waiting in the engine")
        response = complete(limits_server, key)
    waiting.join()
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "server_overloaded" and error["type"] == "server_error"
    assert "1 requests are waiting" in error["message"]
    retry_s = int(response.headers["retry-after"])
    assert 1 <= retry_s <= 60 and int(response.headers["retry-after-ms"]) == retry_s * 1000


def test_the_monthly_quota_counts_actual_usage(limits_server):
    prompt = prompt_tokens(limits_server)
    tenant, key = limits_server.tenant_key(Limits(monthly_tokens=2 * (prompt + 3)))
    for _ in range(2):
        response = complete(limits_server, key, max_tokens=3, ignore_eos=True)
        assert response.status_code == 200
    refused = complete(limits_server, key, max_tokens=1)
    error = assert_openai_429(refused, error_type="insufficient_quota", code="insufficient_quota")
    assert "quota" in error["message"]
    assert refused.headers["x-should-retry"] == "false" and int(refused.headers["retry-after"]) > 0
    me = httpx.get(f"{limits_server.url}/v1/me", headers=bearer(key)).json()
    assert me["limits"]["remaining"]["tenant"]["monthly_tokens"]["remaining"] == 0
    assert me["limits"]["tenant"]["monthly_tokens"] == 2 * (prompt + 3)


def test_throttled_requests_are_counted_per_tenant_for_operators(limits_server):
    tenant, key = limits_server.tenant_key(Limits(requests_per_minute=1))
    assert complete(limits_server, key).status_code == 200
    assert complete(limits_server, key).status_code == 429
    metrics = httpx.get(f"{limits_server.url}/metrics", headers=bearer(limits_server.operator_key)).text
    assert f'loraloom_tenant_throttled_requests_total{{limit="requests",tenant="{tenant}"}} 1.0' in metrics


@pytest.mark.parametrize("path", ["/v1/chat/completions"])
def test_chat_completions_are_limited_too(limits_server, path):
    _, key = limits_server.tenant_key(Limits(requests_per_minute=1))
    body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    first = httpx.post(f"{limits_server.url}{path}", headers=bearer(key), json=body, timeout=120)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "0"
    assert_openai_429(httpx.post(f"{limits_server.url}{path}", headers=bearer(key), json=body, timeout=120),
                      error_type="requests")
