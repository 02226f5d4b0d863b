"""deploy/kubernetes/inferencepool.yaml against itself and against the code: valid YAML of the kinds
an InferencePool deployment needs, selectors that select the pods they mean, one port for the API,
the pool and the metrics, and endpoint-picker metric flags that name metrics the server exposes with
the types the picker expects (so neither the example nor docs/KUBERNETES.md can drift from the code)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import EngineStats
from loraloom.platform.cli.main import build_parser
from loraloom.platform.metering.engine_metrics import EPP_METRIC_FLAGS, LORA_INFO_LABELS, engine_metrics_registry

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "kubernetes" / "inferencepool.yaml"
GUIDE = REPO / "docs" / "KUBERNETES.md"
# What the picker cannot schedule without: queue, KV usage and the LoRA info.
REQUIRED_FLAGS = {"total-queued-requests-metric", "kv-cache-usage-percentage-metric", "lora-info-metric"}


@pytest.fixture(scope="module")
def documents() -> dict[tuple[str, str], dict]:
    """(kind, name) -> the document."""
    loaded = [document for document in yaml.safe_load_all(MANIFEST.read_text()) if document is not None]
    by_key = {(document["kind"], document["metadata"]["name"]): document for document in loaded}
    assert len(by_key) == len(loaded), "two documents share a kind and name"
    return by_key


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def flags(args: list[str]) -> dict[str, str]:
    """--name=value arguments as {name: value}."""
    return dict(arg.removeprefix("--").split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)


def test_the_manifest_holds_what_an_inference_pool_deployment_needs(documents):
    kinds = {kind for kind, _ in documents}
    assert {"InferencePool", "Deployment", "Service", "ConfigMap", "HTTPRoute", "ServiceAccount", "Role",
            "RoleBinding"} <= kinds
    pool = documents[("InferencePool", "loraloom")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"


def test_selectors_select_the_pods_they_mean(documents):
    engine, epp = documents[("Deployment", "loraloom-engine")], documents[("Deployment", "loraloom-epp")]
    for deployment in (engine, epp):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    engine_pods = engine["spec"]["template"]["metadata"]["labels"]
    epp_pods = epp["spec"]["template"]["metadata"]["labels"]
    pool = documents[("InferencePool", "loraloom")]
    assert pool["spec"]["selector"]["matchLabels"].items() <= engine_pods.items()
    assert not pool["spec"]["selector"]["matchLabels"].items() <= epp_pods.items()  # the picker is no model server
    assert documents[("Service", "loraloom-engine")]["spec"]["selector"].items() <= engine_pods.items()
    assert documents[("Service", "loraloom-epp")]["spec"]["selector"].items() <= epp_pods.items()
    assert documents[("RoleBinding", "loraloom-epp")]["subjects"][0]["name"] == epp["spec"]["template"]["spec"][
        "serviceAccountName"]


def test_the_pool_targets_the_port_loraloom_serves_its_api_and_metrics_on(documents):
    serve = container(documents[("Deployment", "loraloom-engine")])
    assert serve["command"] == ["loraloom", "serve"]
    parsed = build_parser().parse_args(["serve", *serve["args"]])  # every argument is one serve takes
    (target,) = documents[("InferencePool", "loraloom")]["spec"]["targetPorts"]
    assert target["number"] == parsed.port == serve["ports"][0]["containerPort"]
    assert serve["readinessProbe"]["httpGet"] == {"path": "/health", "port": parsed.port}
    assert parsed.host == "0.0.0.0"


def test_the_pool_s_picker_is_the_epp_deployment_watching_this_pool(documents):
    pool = documents[("InferencePool", "loraloom")]
    picker = pool["spec"]["endpointPickerRef"]
    service = documents[("Service", picker["name"])]
    (port,) = service["spec"]["ports"]
    epp = container(documents[("Deployment", "loraloom-epp")])
    settings = flags(epp["args"])
    assert picker["port"]["number"] == port["port"] == int(settings["grpc-port"])
    assert settings["pool-name"] == pool["metadata"]["name"]
    config_map = documents[("ConfigMap", "loraloom-epp-config")]
    (mount,) = epp["volumeMounts"]
    config_file = Path(settings["config-file"])
    assert str(config_file.parent) == mount["mountPath"] and config_file.name in config_map["data"]
    config = yaml.safe_load(config_map["data"][config_file.name])
    assert "lora-affinity-scorer" in {plugin["type"] for plugin in config["plugins"]}
    (route_backend,) = documents[("HTTPRoute", "loraloom")]["spec"]["rules"][0]["backendRefs"]
    assert (route_backend["kind"], route_backend["name"]) == ("InferencePool", pool["metadata"]["name"])


def test_the_epp_s_metric_flags_name_the_metrics_we_expose(documents):
    settings = flags(container(documents[("Deployment", "loraloom-epp")])["args"])
    metric_flags = {name: value for name, value in settings.items() if name.endswith("-metric")}
    assert REQUIRED_FLAGS <= metric_flags.keys()
    for name, value in metric_flags.items():
        assert EPP_METRIC_FLAGS[name] == value, name


def test_the_guide_gives_every_flag_with_our_metric_name():
    guide = GUIDE.read_text()
    for name, metric in EPP_METRIC_FLAGS.items():
        assert f"--{name}={metric}" in guide, name


def test_the_metrics_the_flags_name_are_exposed_as_gauges_with_the_protocol_s_labels():
    stats = EngineStats(
        num_running=1, num_waiting=2, kv_blocks_used=3, kv_blocks_total=4, kv_blocks_cached=0,
        adapter_slots_used=1, adapter_slots_total=8, prompt_tokens_total=0, generation_tokens_total=0,
        preemptions_total=0, running_per_adapter={}, waiting_per_adapter={}, requests_per_adapter_total={},
        block_size=16, running_lora_adapters=["a@1"], waiting_lora_adapters=["b@2", "c"],
    )
    text = generate_latest(engine_metrics_registry(lambda: stats)).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for metric in EPP_METRIC_FLAGS.values():
        assert families[metric].type == "gauge", metric
        assert len(families[metric].samples) == 1, metric  # one series: the picker reads one value
    values = {metric: families[metric].samples[0] for metric in EPP_METRIC_FLAGS.values()}
    assert values["loraloom_requests_waiting"].value == 2
    assert values["loraloom_kv_cache_usage_ratio"].value == 0.75
    lora = values["loraloom_lora_requests_info"]
    assert set(lora.labels) == set(LORA_INFO_LABELS)
    assert lora.labels == {"max_lora": "8", "running_lora_adapters": "a@1", "waiting_lora_adapters": "b@2,c"}
    assert values["loraloom_cache_config_info"].labels["block_size"] == "16"


def test_the_epp_scrapes_the_keyless_metrics_port_which_only_it_and_prometheus_reach(documents):
    serve = container(documents[("Deployment", "loraloom-engine")])
    parsed = build_parser().parse_args(["serve", *serve["args"]])
    ports = {port["name"]: port["containerPort"] for port in serve["ports"]}
    assert parsed.metrics_port == ports["metrics"] != parsed.port and parsed.metrics_host == "0.0.0.0"
    epp = documents[("Deployment", "loraloom-epp")]
    assert int(flags(container(epp)["args"])["model-server-metrics-port"]) == parsed.metrics_port
    policy = documents[("NetworkPolicy", "loraloom-engine")]["spec"]
    engine_pods = documents[("Deployment", "loraloom-engine")]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= engine_pods.items()
    (open_rule,) = [rule for rule in policy["ingress"] if "from" not in rule]
    assert [port["port"] for port in open_rule["ports"]] == [parsed.port]  # the API: from anywhere
    (metrics_rule,) = [rule for rule in policy["ingress"] if "from" in rule]
    assert [port["port"] for port in metrics_rule["ports"]] == [parsed.metrics_port]
    allowed_pods = [peer["podSelector"]["matchLabels"] for peer in metrics_rule["from"] if "podSelector" in peer]
    assert allowed_pods == [epp["spec"]["template"]["metadata"]["labels"]]
    service_ports = {port["name"]: port["targetPort"] for port in documents[("Service", "loraloom-engine")]["spec"]["ports"]}
    assert service_ports["metrics"] == parsed.metrics_port
