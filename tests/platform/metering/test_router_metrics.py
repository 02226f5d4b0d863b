"""The metrics Kubernetes LLM routers schedule by (the Gateway API Inference Extension's model-server
protocol, vLLM's types and meanings), scraped from a live server on the bundled model while requests
run and wait: two sequences at a time and two adapter slots for three adapters, so requests queue.

Checked against the protocol: the waiting and running gauges, the KV usage fraction in [0, 1], the
LoRA info gauge's labels listing the adapters of the running and waiting requests as requests name
them, the cache config; then, once every request ended, the latency histograms' counts equal the
requests served and the preemptions counter is there. No timing is asserted."""
from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.metering.engine_metrics import EPP_METRIC_FLAGS, LORA_INFO_LABELS
from loraloom.platform.registry.local import LocalAdapterLookup

ADAPTERS = ("alpha", "beta", "gamma")
MAX_LORAS = 2
MAX_TOKENS = 24
SCRAPE_INTERVAL_S = 0.05
# Two per adapter and two for the base model; with two sequences at a time most of them wait.
REQUESTS = [adapter for adapter in ADAPTERS for _ in range(2)] + ["base", "base"]
HISTOGRAMS = ("loraloom_time_to_first_token_seconds", "loraloom_inter_token_latency_seconds",
              "loraloom_e2e_request_latency_seconds")


@dataclass
class Server:
    url: str
    key: str
    operator_key: str  # /metrics is the operator's

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.key), timeout=300)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("router_adapters")
    adapters = {name: make_peft_adapter(model_dir, root / name, rank=4, alpha=8, target_modules=["q_proj"],
                                        seed=900 + seed)
                for seed, name in enumerate(ADAPTERS)}
    settings = migrated_settings(tmp_path_factory.mktemp("data"))
    key = make_key(settings, tenant="acme", role="developer")
    operator_key = make_key(settings, tenant="default", role="admin")
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64, max_num_seqs=2, max_loras=MAX_LORAS))
    lookup = LocalAdapterLookup({engine.model_name}, adapters, None)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield Server(url=url, key=key, operator_key=operator_key)


def scrape(http: httpx.Client, server: Server) -> dict:
    """The families of one /metrics scrape (with the operator's key), by name (a counter's family drops its _total)."""
    response = http.get("/metrics", headers=bearer(server.operator_key))
    assert response.status_code == 200
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def value(families: dict, name: str) -> float:
    (sample,) = families[name].samples
    return sample.value


def lora_info(families: dict) -> dict[str, str]:
    family = families["loraloom_lora_requests_info"]
    assert family.type == "gauge"
    (sample,) = family.samples  # one series, whatever the adapters
    assert set(sample.labels) == set(LORA_INFO_LABELS)
    assert sample.value > 1e9  # a Unix time: the picker keeps the series with the latest value
    return sample.labels


def listed(labels: dict[str, str], which: str) -> set[str]:
    return {name for name in labels[which].split(",") if name}


def adapters_with_requests(families: dict, name: str) -> set[str]:
    """The adapters the per-adapter gauge counts requests for (the base model left out)."""
    return {sample.labels["adapter"] for sample in families[name].samples
            if sample.value > 0 and sample.labels["adapter"] != "base"}


def test_the_router_metrics_follow_the_protocol_while_requests_run_and_wait(server):
    with server.http() as http:
        before = scrape(http, server)
        for name, kind in (("loraloom_requests_waiting", "gauge"), ("loraloom_requests_running", "gauge"),
                           ("loraloom_kv_cache_usage_ratio", "gauge"), ("loraloom_cache_config_info", "gauge"),
                           ("loraloom_preemptions", "counter")):
            assert before[name].type == kind, name
        assert set(EPP_METRIC_FLAGS.values()) <= before.keys()
        (config,) = before["loraloom_cache_config_info"].samples
        assert config.labels["block_size"] == "16" and int(config.labels["num_gpu_blocks"]) == 64
        served_before = {name: value_of_count(before, name) for name in HISTOGRAMS}

        def complete(model: str) -> dict:
            body = {"model": model, "prompt": "Count: 1, 2, 3,", "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True}
            with server.http() as client:
                response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            pending = [pool.submit(complete, model) for model in REQUESTS]
            seen_waiting = seen_running_adapters = False
            while not all(future.done() for future in pending):
                families = scrape(http, server)
                waiting, running = value(families, "loraloom_requests_waiting"), value(families, "loraloom_requests_running")
                assert 0 <= value(families, "loraloom_kv_cache_usage_ratio") <= 1
                assert running <= 2
                labels = lora_info(families)
                assert labels["max_lora"] == str(MAX_LORAS)
                # Both lists come from the same reading as the per-adapter gauges, and name adapters
                # as the requests' `model` does.
                assert listed(labels, "running_lora_adapters") == adapters_with_requests(
                    families, "loraloom_adapter_requests_running")
                assert listed(labels, "waiting_lora_adapters") == adapters_with_requests(
                    families, "loraloom_adapter_requests_waiting")
                assert len(listed(labels, "running_lora_adapters")) <= MAX_LORAS
                seen_waiting |= waiting > 0 and bool(listed(labels, "waiting_lora_adapters"))
                seen_running_adapters |= bool(listed(labels, "running_lora_adapters"))
                # A pause between scrapes, as a router's poll has: back to back, rendering and parsing
                # /metrics held the server's interpreter most of the time and the requests took ten times longer.
                time.sleep(SCRAPE_INTERVAL_S)
            results = [future.result() for future in pending]

        assert seen_waiting and seen_running_adapters
        after = scrape(http, server)
        served = len(results)
        generated = sum(result["usage"]["completion_tokens"] for result in results)
        assert generated == served * MAX_TOKENS
        assert value_of_count(after, HISTOGRAMS[0]) - served_before[HISTOGRAMS[0]] == served
        assert value_of_count(after, HISTOGRAMS[2]) - served_before[HISTOGRAMS[2]] == served
        # One inter-token gap per token after each request's first.
        assert value_of_count(after, HISTOGRAMS[1]) - served_before[HISTOGRAMS[1]] == generated - served
        assert value(after, "loraloom_preemptions") >= 0
        assert value(after, "loraloom_requests_waiting") == value(after, "loraloom_requests_running") == 0
        assert listed(lora_info(after), "running_lora_adapters") == set()


def value_of_count(families: dict, name: str) -> float:
    """A histogram's _count over all its (tenant, model) series, after checking each is a histogram:
    buckets ending at +Inf, cumulative, matching its _count."""
    family = families[name]
    assert family.type == "histogram"
    total = 0.0
    series = {tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le")) for sample in family.samples}
    for labels in series:
        of_series = [sample for sample in family.samples
                     if tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le")) == labels]
        buckets = [(sample.labels["le"], sample.value) for sample in of_series if sample.name == f"{name}_bucket"]
        (count,) = [sample.value for sample in of_series if sample.name == f"{name}_count"]
        assert [sample.name for sample in of_series if sample.name == f"{name}_sum"] == [f"{name}_sum"]
        assert buckets[-1] == ("+Inf", count)
        assert [number for _, number in buckets] == sorted(number for _, number in buckets)
        total += count
    return total


def test_adapter_residency_is_exposed(server):
    with server.http() as http:
        assert http.post("/v1/completions", json={"model": "alpha", "prompt": "Hi", "max_tokens": 1}).status_code == 200
        families = scrape(http, server)
    for name in ("loraloom_adapter_slots_used", "loraloom_host_cache_adapters", "loraloom_host_cache_bytes"):
        assert families[name].type == "gauge", name
    for name in ("loraloom_host_cache_hits", "loraloom_host_cache_misses", "loraloom_adapter_slot_loads",
                 "loraloom_adapter_slot_evictions"):
        assert families[name].type == "counter", name
    assert value(families, "loraloom_adapter_slots_used") >= 1
    assert value(families, "loraloom_host_cache_adapters") >= 1 and value(families, "loraloom_host_cache_bytes") > 0
    assert value(families, "loraloom_adapter_slot_loads") >= 1
