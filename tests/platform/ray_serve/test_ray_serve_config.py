"""The shipped Serve configs (deploy/ray/) are valid Ray Serve configs for this code: Ray's own builder
call builds their import path (as `serve run` and `loraloom ray` do), their deployment entries name our
deployments, they write no settings (those come from the caller's environment), and `loraloom ray`
refuses SQLite, naming what to start, before it starts anything."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray")
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary  # noqa: E402
from ray.serve._private.utils import import_attr  # noqa: E402
from ray.serve.deployment import Application  # noqa: E402
from ray.serve.schema import ServeDeploySchema  # noqa: E402

from loraloom.platform.cli.main import build_parser  # noqa: E402
from loraloom.platform.cli.ray_command import (  # noqa: E402
    send_ray_token_if_saved,
    shared_settings_env,
    with_settings_env,
)
from loraloom.platform.ray_serve.engine_deployment import ENGINE_DEPLOYMENT, EngineDeployment  # noqa: E402
from loraloom.platform.ray_serve.gateway import GATEWAY_DEPLOYMENT, GatewayDeployment  # noqa: E402
from loraloom.platform.ray_serve.options import AppOptions  # noqa: E402
from loraloom.platform.settings import Settings  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
GPU_CONFIG = REPO / "deploy" / "ray" / "serve_config.yaml"
CPU_CONFIG = REPO / "deploy" / "ray" / "serve_config.cpu.yaml"
LORALOOM = Path(sys.executable).parent / "loraloom"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def deployments(config: dict) -> dict[str, dict]:
    return {deployment["name"]: deployment for deployment in config["applications"][0]["deployments"]}


@pytest.mark.parametrize("path", [GPU_CONFIG, CPU_CONFIG], ids=["gpu", "cpu"])
def test_ray_builds_the_application_of_each_shipped_config(path):
    schema = ServeDeploySchema.model_validate(load(path))
    (application,) = schema.applications
    # What Ray runs for the config's import_path: it refused our earlier keyword-only builder.
    built = call_user_app_builder_with_args_if_necessary(import_attr(application.import_path), application.args)
    assert isinstance(built, Application)
    assert {deployment.name for deployment in application.deployments} == {ENGINE_DEPLOYMENT, GATEWAY_DEPLOYMENT}
    AppOptions.from_args(application.args).engine_config()  # its engine fields are EngineConfig's
    assert not any(application.runtime_env.get("env_vars", {})), "settings come from the caller's environment"


def test_the_cpu_config_runs_two_cpu_engine_replicas_of_the_bundled_model():
    config = load(CPU_CONFIG)
    assert "model" not in config["applications"][0]["args"]  # the bundled model
    engine = deployments(config)[ENGINE_DEPLOYMENT]
    assert engine["num_replicas"] == 2
    assert engine["ray_actor_options"]["num_gpus"] == 0
    cpus = sum(deployment["num_replicas"] * deployment["ray_actor_options"]["num_cpus"]
               for deployment in deployments(config).values())
    assert cpus <= 2, "the replicas must fit on a two-core machine"


def test_the_callers_settings_reach_every_application(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url="postgresql+psycopg://u@db:5432/x")
    environ = {"LORALOOM_DATABASE_URL": "postgresql+psycopg://u@db:5432/x", "LORALOOM_BROKER_URL": "redis://r:6379/0",
               "HOME": "/root"}
    filled = with_settings_env(load(CPU_CONFIG), shared_settings_env(environ, settings))
    (application,) = filled["applications"]
    env_vars = application["runtime_env"]["env_vars"]
    assert env_vars == {"LORALOOM_DATABASE_URL": "postgresql+psycopg://u@db:5432/x",
                        "LORALOOM_BROKER_URL": "redis://r:6379/0",
                        "LORALOOM_STORAGE_URL": (tmp_path / "blobs").as_uri(), "LORALOOM_DATA_DIR": str(tmp_path)}
    ServeDeploySchema.model_validate(filled)


@pytest.mark.parametrize("database", [None, "sqlite:///{dir}/x.db"], ids=["default", "explicit"])
def test_sqlite_is_refused_naming_postgresql(tmp_path, database):
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env["LORALOOM_DATA_DIR"] = str(tmp_path)
    if database is not None:
        env["LORALOOM_DATABASE_URL"] = database.format(dir=tmp_path)
    result = subprocess.run([str(LORALOOM), "ray", "run", "--config", str(CPU_CONFIG)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "SQLite" in result.stderr and "Start PostgreSQL" in result.stderr, result.stderr
    assert "LORALOOM_DATABASE_URL=postgresql+psycopg://" in result.stderr, result.stderr
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "loraloom.db").exists()  # refused before migrating


def test_bad_args_in_a_config_are_refused_before_a_cluster_starts(tmp_path):
    config = load(CPU_CONFIG)
    config["applications"][0]["args"]["engine"]["max_lora"] = 8
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    env = {name: value for name, value in os.environ.items() if not name.startswith("LORALOOM_")}
    env["LORALOOM_DATA_DIR"] = str(tmp_path)
    result = subprocess.run([str(LORALOOM), "ray", "run", "--config", str(tmp_path / "bad.yaml")], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "application 'loraloom': args.engine: unknown fields ['max_lora']" in result.stderr, result.stderr
    assert "Started a local Ray instance" not in result.stderr  # refused before any cluster started


def test_deploy_sends_a_saved_ray_token_unless_a_mode_is_chosen(tmp_path):
    saved = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}
    send_ray_token_if_saved(saved)
    assert saved["RAY_AUTH_MODE"] == "token"
    chosen = {"RAY_AUTH_TOKEN": "t", "RAY_AUTH_MODE": "disabled"}
    send_ray_token_if_saved(chosen)
    assert chosen["RAY_AUTH_MODE"] == "disabled"


def test_the_ray_verbs_parse():
    args = build_parser().parse_args(["ray", "deploy", "--config", str(GPU_CONFIG), "--address", "http://head:8265"])
    assert (args.ray_command, args.config, args.address) == ("deploy", GPU_CONFIG, "http://head:8265")
    args = build_parser().parse_args(["ray", "run", "--config", str(CPU_CONFIG), "--port", "18000"])
    assert (args.ray_command, args.port) == ("run", 18000)


def test_bad_application_args_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"args.engine: unknown fields \['max_lora'\]"):
        AppOptions.from_args({"engine": {"max_lora": 8}})
    with pytest.raises(ValueError, match=r"args: unknown keys \['modle'\]"):
        AppOptions.from_args({"modle": "/m"})
    with pytest.raises(ValueError, match=r"args.routing: unknown fields \['spill'\]"):
        AppOptions.from_args({"routing": {"spill": 1}})
    with pytest.raises(ValueError, match=r"routing.max_replicas_per_adapter must be >= 1"):
        AppOptions.from_args({"routing": {"max_replicas_per_adapter": 0}})


def test_the_gateway_never_caps_what_the_engines_batch():
    """A gateway replica holds at most max_ongoing_requests requests; below what its engine replicas
    take, the engine batches fewer requests than users send (Ray Serve's default of 5 halved the
    mixed benchmark's throughput)."""
    engine_takes = EngineDeployment.max_ongoing_requests
    assert GatewayDeployment.max_ongoing_requests >= 2 * engine_takes
    for path in (GPU_CONFIG, CPU_CONFIG):
        entries = deployments(load(path))
        for name in (ENGINE_DEPLOYMENT, GATEWAY_DEPLOYMENT):
            assert "max_ongoing_requests" in entries[name], (path.name, name)
        engines = entries[ENGINE_DEPLOYMENT]
        replicas = engines.get("num_replicas") or engines["autoscaling_config"]["max_replicas"]
        assert entries[GATEWAY_DEPLOYMENT]["max_ongoing_requests"] >= replicas * engines["max_ongoing_requests"], path.name
