"""The metrics an operator reads, scraped from a live server on the bundled model: the latency
histograms and finished-request counter by tenant and model, with adapters past the cap folded into
model="other"; HTTP responses by route template and status; API errors by type and code (a response's
and a stream's). The replica label of Ray's per-replica series is in test_replica_metrics.py, the
training families in test_training_metrics.py."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread, wait_until
from lora_factory import make_peft_adapter
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.api.response_metrics import ResponseMetrics
from loraloom.platform.metering.http_metrics import HttpResponseCounts
from loraloom.platform.registry.local import LocalAdapterLookup

ADAPTERS = ("alpha", "beta", "gamma")
MAX_TOKENS = 3


@dataclass
class Server:
    url: str
    keys: dict[str, str]  # acme and globex: the label test's; initech: the other tests' (base model only)
    operator_key: str

    def http(self, tenant: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.keys[tenant]), timeout=300)

    def scrape(self) -> list:
        response = httpx.get(f"{self.url}/metrics", headers=bearer(self.operator_key), timeout=60)
        assert response.status_code == 200
        return [sample for family in text_string_to_metric_families(response.text) for sample in family.samples]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("operator_adapters")
    adapters = {name: make_peft_adapter(model_dir, root / name, rank=4, alpha=8, target_modules=["q_proj"],
                                        seed=40 + seed)
                for seed, name in enumerate(ADAPTERS)}
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    keys = {tenant: make_key(settings, tenant=tenant, role="developer") for tenant in ("acme", "globex", "initech")}
    operator_key = make_key(settings, tenant="default", role="admin")
    # Two (tenant, adapter) pairs get labels of their own; the engine's cap, as `serve --metrics-max-adapters 2`.
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64, metrics_max_adapters=2))
    with serve_in_thread(create_app(engine, LocalAdapterLookup({engine.model_name}, adapters, None), settings)) as url:
        yield Server(url=url, keys=keys, operator_key=operator_key)


def counts_by(samples: list, name: str, *labels: str, **matching: str) -> dict[tuple[str, ...], float]:
    """The samples called `name` whose labels include `matching`, keyed by the values of `labels`."""
    return {tuple(sample.labels[label] for label in labels): sample.value for sample in samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in matching.items())}


def complete(server: Server, tenant: str, model: str) -> httpx.Response:
    with server.http(tenant) as http:
        return http.post("/v1/completions", json={"model": model, "prompt": "1, 2,", "max_tokens": MAX_TOKENS,
                                                  "temperature": 0, "ignore_eos": True})


def test_latencies_and_finishes_are_labelled_by_tenant_and_model_and_adapters_past_the_cap_fold(server):
    # In this order: acme's alpha and beta take the two named pairs; acme's gamma and globex's alpha
    # (a pair of its own: names are per tenant) come later and fold; the base model never does.
    sent = [("acme", "alpha"), ("acme", "beta"), ("acme", "gamma"), ("globex", "alpha"), ("acme", "alpha"),
            ("globex", "base")]
    for tenant, model in sent:
        assert complete(server, tenant, model).status_code == 200
    expected = {("acme", "alpha"): 2, ("acme", "beta"): 1, ("acme", "other"): 1, ("globex", "other"): 1,
                ("globex", "base"): 1}
    samples = server.scrape()
    for histogram in ("loraloom_time_to_first_token_seconds", "loraloom_e2e_request_latency_seconds"):
        assert counts_by(samples, f"{histogram}_count", "tenant", "model") == expected, histogram
        # Each series is a whole histogram: cumulative buckets up to +Inf, which equals its count.
        inf = counts_by(samples, f"{histogram}_bucket", "tenant", "model", le="+Inf")
        assert inf == expected, histogram
    gaps = counts_by(samples, "loraloom_inter_token_latency_seconds_count", "tenant", "model")
    assert gaps == {labels: count * (MAX_TOKENS - 1) for labels, count in expected.items()}
    finished = counts_by(samples, "loraloom_requests_finished_total", "tenant", "model", "finished_reason")
    assert finished == {(*labels, "length"): count for labels, count in expected.items()}
    # The requests counter folds the same pairs.
    requests = counts_by(samples, "loraloom_adapter_requests_total", "tenant", "adapter")
    assert requests == expected


def test_a_stream_the_client_closes_is_counted_as_aborted(server):
    body = {"model": "base", "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with server.http("initech") as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        next(line for line in response.iter_lines() if line.startswith("data: {"))  # a first token, then leave

    def aborted() -> float:
        return counts_by(server.scrape(), "loraloom_requests_finished_total", "finished_reason",
                         tenant="initech", model="base").get(("abort",), 0)

    wait_until(lambda: aborted() == 1, "the aborted request's count")


def test_responses_are_counted_by_route_template_and_status_and_errors_by_type_and_code(server):
    responses = ("loraloom_http_responses_total", "method", "route", "status")
    errors = ("loraloom_api_errors_total", "type", "code")
    before = server.scrape()
    with server.http("initech") as http:
        assert http.post("/v1/completions", json={"model": "no-such-adapter", "prompt": "Hi"}).status_code == 404
        assert http.post("/v1/completions", json={"model": "base", "prompt": "Hi", "max_tokens": -1}).status_code == 400
        assert http.get("/v1/fine_tuning/jobs/ftjob-0123456789abcdef").status_code == 404
        assert http.get("/v1/no-such-route").status_code == 404
        assert http.get("/v1/models").status_code == 200

    def grown(counts: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        new, old = counts_by(server.scrape(), *counts), counts_by(before, *counts)
        return {labels: value - old.get(labels, 0) for labels, value in new.items() if value != old.get(labels, 0)}

    # The scrapes themselves are responses too: GET /metrics, counted once each has been answered.
    assert {labels: n for labels, n in grown(responses).items() if labels[1] != "/metrics"} == {
        ("POST", "/v1/completions", "404"): 1, ("POST", "/v1/completions", "400"): 1,
        ("GET", "/v1/fine_tuning/jobs/{job_id}", "404"): 1,  # the template, never the job id
        ("GET", "unmatched", "404"): 1, ("GET", "/v1/models", "200"): 1,
    }
    assert grown(errors) == {("invalid_request_error", "model_not_found"): 1, ("invalid_request_error", ""): 2,
                             ("invalid_request_error", "not_found"): 1}


def test_an_error_inside_a_stream_is_counted_by_its_type_and_code():
    # The middleware on an app of one route whose stream fails after its 200, as a generation can.
    async def failing_stream(request):
        async def events():
            yield 'data: {"id": "1", "choices": []}\n\n'
            yield 'data: {"error": {"message": "gone", "type": "server_error", "param": null, ' \
                  '"code": "engine_unavailable"}}\n\n'
        return StreamingResponse(events(), media_type="text/event-stream")

    async def refused(request):
        return JSONResponse({"error": {"message": "no", "type": "invalid_request_error", "param": "x",
                                       "code": "bad_x"}}, status_code=400)

    counts = HttpResponseCounts()
    app = ResponseMetrics(Starlette(routes=[Route("/stream/{n}", failing_stream), Route("/refused", refused)]), counts)
    with TestClient(app) as client:
        assert client.get("/stream/7").status_code == 200
        assert client.get("/refused").status_code == 400
    families = {family.name: family for family in counts.collect()}
    assert {tuple(s.labels.values()): s.value for s in families["loraloom_api_errors"].samples} == {
        ("server_error", "engine_unavailable"): 1, ("invalid_request_error", "bad_x"): 1}
    assert {tuple(s.labels.values()): s.value for s in families["loraloom_http_responses"].samples} == {
        ("GET", "/stream/{n}", "200"): 1, ("GET", "/refused", "400"): 1}


def test_the_training_families_are_part_of_the_scrape(server):
    samples = server.scrape()
    assert counts_by(samples, "loraloom_training_jobs", "status") == {
        (status,): 0 for status in ("validating_files", "queued", "running", "succeeded", "failed",
                                    "cancel_requested", "cancelled", "pause_requested", "paused")}
    assert counts_by(samples, "loraloom_training_queue_wait_seconds_count") == {(): 0}

