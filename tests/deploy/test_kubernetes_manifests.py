"""The Kubernetes kit (deploy/kubernetes, kustomization.yaml's files) against itself and against the
code: the objects a deployment needs, selectors that select the pods they mean, one port for the API,
the pool and the metrics, endpoint-picker metric flags that name metrics the server exposes with the
types the picker expects, settings that are loraloom's settings, commands the CLI takes, and pods that
wait for the migration Job (so neither the kit nor docs/KUBERNETES.md can drift from the code).
test_kubernetes_schemas.py checks the same objects against the Kubernetes API's schemas."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kit import KIT, documents_by_key, kit_documents, kit_files, kustomization
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import EngineStats
from loraloom.platform.api.console import MOUNT as CONSOLE_MOUNT
from loraloom.platform.api.routes import chat, completions
from loraloom.platform.cli.main import build_parser
from loraloom.platform.metering.engine_metrics import EPP_METRIC_FLAGS, LORA_INFO_LABELS, engine_metrics_registry
from loraloom.platform.settings import Settings

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "KUBERNETES.md"
# What the picker cannot schedule without: queue, KV usage and the LoRA info.
REQUIRED_FLAGS = {"total-queued-requests-metric", "kv-cache-usage-percentage-metric", "lora-info-metric"}
IMAGE = "loraloom"  # the name every loraloom container uses; kustomization.yaml's images entry sets it
LONG_RUNNING = [("Deployment", "loraloom-engine"), ("Deployment", "loraloom-training-worker"),
                ("Deployment", "loraloom-api")]
LORALOOM_WORKLOADS = [*LONG_RUNNING, ("Job", "loraloom-migrate")]
# Settings boto3 reads itself (settings.yaml's Secret): the S3 credentials.
NON_LORALOOM_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


@pytest.fixture(scope="module")
def documents() -> dict[tuple[str, str], dict]:
    """(kind, name) -> the document."""
    return documents_by_key()


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


# The kit around the pool: kustomization, image, settings, migrations, workers, probes and routes.

def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def test_the_kustomization_lists_every_manifest_of_the_folder():
    listed = {path.name for path in kit_files()}
    assert listed == {path.name for path in KIT.glob("*.yaml")} - {"kustomization.yaml"}


def test_every_loraloom_container_runs_the_one_image_the_kustomization_sets(documents):
    (image,) = kustomization()["images"]
    assert image["name"] == IMAGE
    for key in LORALOOM_WORKLOADS:
        spec = pod_spec(documents[key])
        for each in spec.get("initContainers", []) + spec["containers"]:
            assert each["image"] == IMAGE, (key, each["name"])
    loraloom_images = {each["image"] for _, document in kit_documents() if document["kind"] in ("Deployment", "Job")
                       for each in pod_spec(document)["containers"] if each.get("command", [""])[0] == "loraloom"}
    assert loraloom_images == {IMAGE}


def test_the_settings_are_loraloom_settings_that_validate(documents, monkeypatch):
    config = documents[("ConfigMap", "loraloom-settings")]["data"]
    secret = documents[("Secret", "loraloom-control-plane")]["stringData"]
    assert not config.keys() & secret.keys()  # one place for each
    environment = {**config, **secret}
    fields = {f"LORALOOM_{name.upper()}" for name in Settings.model_fields}
    loraloom_keys = {key for key in environment if key.startswith("LORALOOM_")}
    assert loraloom_keys - fields == set(), "not a setting of platform/settings.py"
    assert environment.keys() - loraloom_keys <= NON_LORALOOM_KEYS
    # Pods share the database, blobs and queue: none may be left to its one-machine default.
    assert {"LORALOOM_DATABASE_URL", "LORALOOM_STORAGE_URL", "LORALOOM_BROKER_URL"} <= loraloom_keys
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # pydantic's own validation of every value
    assert settings.database_url.startswith("postgresql") and settings.storage_url.startswith("s3://")
    assert all("REPLACE-ME" in secret[key] for key in secret)  # placeholders, never a credential


def test_every_loraloom_container_gets_the_settings(documents):
    wanted = [{"configMapRef": {"name": "loraloom-settings"}}, {"secretRef": {"name": "loraloom-control-plane"}}]
    for key in LORALOOM_WORKLOADS:
        spec = pod_spec(documents[key])
        for each in spec.get("initContainers", []) + spec["containers"]:
            assert each["envFrom"] == wanted, (key, each["name"])


def test_the_migration_job_upgrades_and_every_long_running_pod_waits_for_it(documents):
    job = documents[("Job", "loraloom-migrate")]
    (migrate,) = pod_spec(job)["containers"]
    assert build_parser().parse_args(migrate["command"][1:]).db_command == "upgrade"
    assert pod_spec(job)["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] >= 1
    for key in LONG_RUNNING:
        (wait,) = pod_spec(documents[key])["initContainers"]
        parsed = build_parser().parse_args(wait["command"][1:])
        assert (parsed.command, parsed.db_command) == ("db", "check"), key
        assert parsed.wait >= 300, key  # long enough for a migration; a pod that gives up restarts and waits again


def test_the_training_worker_trains_on_the_served_base_with_a_gpu(documents):
    worker = documents[("Deployment", "loraloom-training-worker")]
    (container,) = pod_spec(worker)["containers"]
    parsed = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert parsed.command == "worker"
    serve = documents[("Deployment", "loraloom-engine")]["spec"]["template"]["spec"]["containers"][0]
    served = build_parser().parse_args(["serve", *serve["args"]])
    assert parsed.model == served.model and served.no_worker  # the engine pods leave training to these
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert serve["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_pods_run_as_the_image_s_unprivileged_user(documents):
    dockerfile_user = next(line.split()[1] for line in (REPO / "Dockerfile").read_text().splitlines()
                           if line.startswith("USER "))
    for key in LORALOOM_WORKLOADS:
        context = pod_spec(documents[key])["securityContext"]
        assert context["runAsNonRoot"] is True and str(context["runAsUser"]) == dockerfile_user.split(":")[0], key


def test_every_probe_asks_health_on_the_api_port(documents):
    for name in ("loraloom-engine", "loraloom-api"):
        serve = container(documents[("Deployment", name)])
        port = build_parser().parse_args(["serve", *serve["args"]]).port
        probes = [serve[probe] for probe in ("startupProbe", "readinessProbe", "livenessProbe") if probe in serve]
        assert {"readinessProbe", "livenessProbe"} <= serve.keys(), name
        assert all(probe["httpGet"] == {"path": "/health", "port": port} for probe in probes), name
        assert "initialDelaySeconds" not in serve["livenessProbe"], name  # a startup probe holds it off, if any
    startup = container(documents[("Deployment", "loraloom-engine")])["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # an 8B model's load and graph capture


def test_the_control_plane_serves_the_engines_base_without_an_engine_or_a_gpu(documents):
    engine = build_parser().parse_args(["serve", *container(documents[("Deployment", "loraloom-engine")])["args"]])
    api_container = container(documents[("Deployment", "loraloom-api")])
    api = build_parser().parse_args([*api_container["command"][1:], *api_container["args"]])
    assert api.command == "serve" and api.no_engine and api.no_worker and not engine.no_engine
    # The facts both report of the base (its config, tokenizer and the largest rank) must agree.
    assert (api.model, api.max_lora_rank) == (engine.model, engine.max_lora_rank)
    assert "nvidia.com/gpu" not in str(api_container.get("resources", {}))
    service = documents[("Service", "loraloom-api")]["spec"]
    pods = documents[("Deployment", "loraloom-api")]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pods.items()
    policy = documents[("NetworkPolicy", "loraloom-api")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pods.items()
    metrics_rule = next(rule for rule in policy["ingress"] if rule["ports"] == [{"port": api.metrics_port}])
    assert all("namespaceSelector" in source for source in metrics_rule["from"])  # Prometheus only


def test_generation_goes_to_the_pool_and_the_rest_of_the_api_to_the_control_plane(documents):
    inference_rule, api_rule = documents[("HTTPRoute", "loraloom")]["spec"]["rules"]
    generation = {route.path for module in (chat, completions) for route in module.router.routes}
    assert {match["path"]["value"] for match in inference_rule["matches"]} == generation
    assert all(match["path"]["type"] == "Exact" for match in inference_rule["matches"])
    assert {match["path"]["value"] for match in api_rule["matches"]} == {"/v1", CONSOLE_MOUNT}
    (backend,) = api_rule["backendRefs"]
    service = documents[("Service", backend["name"])]
    assert backend["name"] == "loraloom-api"  # the control plane: no engine pod holds an upload
    serve = container(documents[("Deployment", "loraloom-api")])
    assert backend["port"] in {port["port"] for port in service["spec"]["ports"] if port["targetPort"] == 8000}
    assert build_parser().parse_args(["serve", *serve["args"]]).port == 8000
    gateway = documents[("Gateway", "inference-gateway")]
    assert [ref["name"] for ref in documents[("HTTPRoute", "loraloom")]["spec"]["parentRefs"]] == [
        gateway["metadata"]["name"]]


def test_the_data_volume_is_where_the_image_puts_loraloom_s_data(documents):
    data_dir = next(line.split("=", 1)[1].strip() for line in (REPO / "Dockerfile").read_text().splitlines()
                    if line.strip().startswith("LORALOOM_DATA_DIR="))
    for key in LONG_RUNNING:
        (main,) = pod_spec(documents[key])["containers"]
        mounts = {mount["name"]: mount["mountPath"] for mount in main["volumeMounts"]}
        assert mounts["data"] == data_dir, key
