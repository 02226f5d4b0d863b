"""deploy/prometheus/prometheus.yml against the code and the Kubernetes example: the keyless job
scrapes a loopback metrics port, the API-port job sends the operator's key from a file (no key is
written in the config), and the Kubernetes job keeps exactly the engine pods' `metrics` port, which
the NetworkPolicy opens to Prometheus' namespace."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loraloom.platform.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
MANIFEST = REPO / "deploy" / "kubernetes" / "inferencepool.yaml"


@pytest.fixture(scope="module")
def jobs() -> dict[str, dict]:
    config = yaml.safe_load(CONFIG.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


@pytest.fixture(scope="module")
def engine_deployment() -> dict:
    documents = [document for document in yaml.safe_load_all(MANIFEST.read_text()) if document]
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def test_every_job_scrapes_the_metrics_path(jobs):
    assert set(jobs) == {"loraloom", "loraloom-api", "loraloom-kubernetes"}
    assert all(job["metrics_path"] == "/metrics" for job in jobs.values())


def test_the_keyless_job_scrapes_serve_s_metrics_port_on_loopback(jobs):
    (target,) = jobs["loraloom"]["static_configs"][0]["targets"]
    host, port = target.rsplit(":", 1)
    parsed = build_parser().parse_args(["serve", "--metrics-port", port])
    assert host == parsed.metrics_host == "127.0.0.1"  # where serve binds it unless told otherwise
    assert "authorization" not in jobs["loraloom"]


def test_the_api_port_job_sends_the_operator_key_from_a_file(jobs):
    job = jobs["loraloom-api"]
    assert job["authorization"]["type"] == "Bearer"
    assert set(job["authorization"]) == {"type", "credentials_file"}  # never inline credentials
    (target,) = job["static_configs"][0]["targets"]
    assert int(target.rsplit(":", 1)[1]) == build_parser().parse_args(["serve"]).port


def test_the_kubernetes_job_keeps_the_engine_pods_metrics_port(jobs, engine_deployment):
    keep = {rule["source_labels"][0]: rule["regex"] for rule in jobs["loraloom-kubernetes"]["relabel_configs"]
            if rule["action"] == "keep"}
    engine = engine_deployment[("Deployment", "loraloom-engine")]["spec"]["template"]
    assert keep["__meta_kubernetes_pod_label_app"] == engine["metadata"]["labels"]["app"]
    (serve,) = engine["spec"]["containers"]
    named = {port["name"]: port["containerPort"] for port in serve["ports"]}
    metrics_port = named[keep["__meta_kubernetes_pod_container_port_name"]]
    assert metrics_port == build_parser().parse_args(["serve", *serve["args"]]).metrics_port
    policy = engine_deployment[("NetworkPolicy", "loraloom-engine")]["spec"]
    (rule,) = [rule for rule in policy["ingress"] if "from" in rule]
    assert [port["port"] for port in rule["ports"]] == [metrics_port]
    assert any(peer.get("namespaceSelector") for peer in rule["from"])  # Prometheus' namespace
