"""deploy/ray/serve_config.yaml is a valid Ray Serve config for this code: its import path builds the
application, its deployment entries name our deployments, and `loraloom ray` reads its settings."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray")
from ray.serve.schema import ServeDeploySchema  # noqa: E402

from loraloom.platform.cli.main import build_parser  # noqa: E402
from loraloom.platform.cli.ray_command import config_settings_env  # noqa: E402
from loraloom.platform.ray_serve.app import build_app  # noqa: E402
from loraloom.platform.ray_serve.engine_deployment import ENGINE_DEPLOYMENT, EngineDeployment  # noqa: E402
from loraloom.platform.ray_serve.gateway import GATEWAY_DEPLOYMENT, GatewayDeployment  # noqa: E402
from loraloom.platform.ray_serve.options import AppOptions  # noqa: E402

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "ray" / "serve_config.yaml"


def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_the_config_is_a_ray_serve_config_of_our_application():
    schema = ServeDeploySchema.model_validate(config())
    (application,) = schema.applications
    module, _, name = application.import_path.partition(":")
    assert getattr(importlib.import_module(module), name) is build_app
    assert {deployment.name for deployment in application.deployments} == {ENGINE_DEPLOYMENT, GATEWAY_DEPLOYMENT}
    AppOptions.from_args(application.args).engine_config()  # its engine fields are EngineConfig's


def test_loraloom_ray_prepares_the_database_the_config_names():
    settings = config_settings_env(config())
    assert settings["LORALOOM_DATABASE_URL"].startswith("postgresql")
    assert all(name.startswith("LORALOOM_") for name in settings)
    args = build_parser().parse_args(["ray", "deploy", "--config", str(CONFIG), "--address", "http://head:8265"])
    assert (args.ray_command, args.config, args.address) == ("deploy", CONFIG, "http://head:8265")


def test_bad_application_args_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"args.engine: unknown fields \['max_lora'\]"):
        AppOptions.from_args({"engine": {"max_lora": 8}})
    with pytest.raises(ValueError, match=r"args: unknown keys \['modle'\]"):
        AppOptions.from_args({"modle": "/m"})


def test_the_gateway_never_caps_what_the_engines_batch():
    """A gateway replica holds at most max_ongoing_requests requests; below what its engine replicas
    take, the engine batches fewer requests than users send (Ray Serve's default of 5 halved the
    mixed benchmark's throughput)."""
    engine_takes = EngineDeployment.max_ongoing_requests
    assert GatewayDeployment.max_ongoing_requests >= 2 * engine_takes
    deployments = {deployment["name"]: deployment for deployment in config()["applications"][0]["deployments"]}
    for name in (ENGINE_DEPLOYMENT, GATEWAY_DEPLOYMENT):
        assert "max_ongoing_requests" in deployments[name], name
    assert deployments[GATEWAY_DEPLOYMENT]["max_ongoing_requests"] >= 2 * deployments[ENGINE_DEPLOYMENT]["max_ongoing_requests"]
