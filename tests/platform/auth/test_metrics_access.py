"""/metrics is the operator's: on the API's port only the operator's key reads it (no key: 401, a
tenant's keys, its admin's included: 403), and `serve --metrics-port` serves the same registry
without a key on a listener of its own, on loopback unless told otherwise."""
from __future__ import annotations

import httpx
from live_api import bearer
from prometheus_client.parser import text_string_to_metric_families

from loraloom.platform.cli.main import build_parser
from loraloom.platform.cli.serve import serve_metrics


def families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_metrics_on_the_api_port_answer_the_operator_only(access_server):
    with httpx.Client(base_url=access_server.url, timeout=60) as http:
        assert http.get("/metrics").status_code == 401
        for tenant_key in ("inference", "developer", "admin", "globex"):
            refused = http.get("/metrics", headers=bearer(access_server.keys[tenant_key]))
            assert refused.status_code == 403, tenant_key
            assert refused.json()["error"]["code"] in ("insufficient_role", "operator_only")
            assert "loraloom_" not in refused.text
        scraped = http.get("/metrics", headers=bearer(access_server.keys["operator"]))
    assert scraped.status_code == 200
    assert "loraloom_requests_waiting" in families(scraped.text)


def test_the_metrics_port_serves_the_same_registry_without_a_key(access_server):
    metrics = serve_metrics(access_server.app, "127.0.0.1", 0)
    try:
        scraped = httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=60)
        assert metrics.server.server_address[0] == "127.0.0.1"
    finally:
        metrics.stop()
    assert scraped.status_code == 200
    on_api_port = httpx.get(f"{access_server.url}/metrics", headers=bearer(access_server.keys["operator"]), timeout=60)
    assert families(scraped.text) == families(on_api_port.text)


def test_the_metrics_port_is_off_by_default_and_bound_to_loopback_when_on():
    parser = build_parser()
    default = parser.parse_args(["serve"])
    assert default.metrics_port is None
    on = parser.parse_args(["serve", "--metrics-port", "9090"])
    assert (on.metrics_port, on.metrics_host) == (9090, "127.0.0.1")
