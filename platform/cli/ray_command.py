"""`loraloom ray run|deploy`: loraloom on Ray Serve (platform/ray_serve), from a Serve config file
(deploy/ray/serve_config.yaml, or serve_config.cpu.yaml on CPUs).

It reads the settings as `serve` does (the caller's LORALOOM_* environment, under any the file's
applications set in their runtime_env), refuses a database or blob store the processes of a cluster
cannot share, prepares the database (migrations, the bootstrap admin key written to its file), and writes the settings into
every application's runtime_env, so the gateways and replicas use what the caller named even on a
cluster whose processes never saw the caller's environment. Then it runs (platform/ray_serve/serve_runner.py)
or deploys the file, which otherwise means exactly what Ray Serve's documentation says it means."""
from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

DEFAULT_CONFIG = Path("deploy/ray/serve_config.yaml")
SETTINGS_PREFIX = "LORALOOM_"
BUILDER = "loraloom.platform.ray_serve.app:build_app"
POSTGRES_EXAMPLE = "postgresql+psycopg://loraloom@127.0.0.1:5432/loraloom"


def add_ray_command(commands: argparse._SubParsersAction) -> None:
    ray = commands.add_parser("ray", help="serve on Ray Serve: engine replicas with adapter affinity, gateways in front")
    verbs = ray.add_subparsers(dest="ray_command", required=True)
    for verb, help_text in (("run", "start a local Ray cluster (or join RAY_ADDRESS) and serve in the foreground; "
                                    "Ctrl-C stops it"),
                            ("deploy", "deploy onto a running Ray cluster and return")):
        command = verbs.add_parser(verb, help=help_text)
        command.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                             help=f"Ray Serve config file (default: {DEFAULT_CONFIG})")
        if verb == "deploy":
            command.add_argument("--address", default="http://localhost:8265",
                                 help="the cluster's dashboard address (default: %(default)s)")
        else:
            command.add_argument("--port", type=int, help="serve HTTP on this port instead of the file's http_options.port")


def config_settings_env(config: dict) -> dict[str, str]:
    """The LORALOOM_* variables the config's applications set in their runtime_env."""
    found: dict[str, str] = {}
    for application in config.get("applications") or []:
        env_vars = ((application.get("runtime_env") or {}).get("env_vars")) or {}
        found.update({name: str(value) for name, value in env_vars.items() if name.startswith(SETTINGS_PREFIX)})
    return found


def shared_settings_env(environ: dict[str, str], settings) -> dict[str, str]:
    """What every gateway and replica must read: the caller's LORALOOM_* variables, with the database,
    blob store and data directory as this command resolved them (a default such as the data directory
    under the home directory must not be resolved again, differently, by a process elsewhere)."""
    shared = {name: value for name, value in environ.items() if name.startswith(SETTINGS_PREFIX)}
    shared.update({"LORALOOM_DATABASE_URL": settings.database_url, "LORALOOM_STORAGE_URL": settings.storage_url,
                   "LORALOOM_DATA_DIR": str(settings.data_dir)})
    return shared


def with_settings_env(config: dict, env: dict[str, str]) -> dict:
    """The config with `env` in each application's runtime_env env_vars (values already there kept)."""
    filled = copy.deepcopy(config)
    for application in filled.get("applications") or []:
        runtime_env = application.setdefault("runtime_env", {}) or {}
        application["runtime_env"] = runtime_env
        runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    return filled


def check_application_args(config: dict) -> None:
    """Refuse bad `args` of our applications here, named, before a cluster starts: Ray would report
    them only once its build task ran (and `serve run` retried the build forever)."""
    from loraloom.platform.ray_serve.options import AppOptions  # imported here: it needs torch

    for application in config.get("applications") or []:
        if application.get("import_path") == BUILDER:
            try:
                AppOptions.from_args(application.get("args") or {})
            except ValueError as error:
                sys.exit(f"loraloom ray: application {application.get('name', '')!r}: {error}")


def refuse_unshareable(settings, command: str) -> None:
    """Exit naming what to start when the settings name something the cluster's processes cannot share."""
    if settings.database_url.startswith("sqlite"):
        sys.exit(
            f"loraloom ray: the database is SQLite ({settings.database_url}), which the gateway and engine "
            f"replicas, each a process of its own, cannot share. Start PostgreSQL and name it, for example:\n"
            f"  LORALOOM_DATABASE_URL={POSTGRES_EXAMPLE} loraloom ray {command} --config <file>"
        )


def storage_note(settings) -> str | None:
    if settings.storage_url.startswith("file:"):
        return (f"loraloom ray: blob store {settings.storage_url} is a local directory: it is shared by the "
                f"processes of this machine only; on a cluster of several machines set LORALOOM_STORAGE_URL="
                f"s3://bucket/prefix (and LORALOOM_S3_ENDPOINT_URL for MinIO or another S3-compatible server)")
    return None


def send_ray_token_if_saved(environ: dict[str, str]) -> None:
    """`deploy` talks to the dashboard over HTTP, which sends the cluster's token only in token mode;
    clusters started with `ray.init` (as `ray run` does) want one. As `ray.init` does for a driver: a
    saved token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) and no mode chosen means
    token mode. Set before Ray is imported, which reads the mode once."""
    if "RAY_AUTH_MODE" in environ:
        return
    saved = environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH") or (Path.home() / ".ray" / "auth_token").is_file()
    if saved:
        environ["RAY_AUTH_MODE"] = "token"


def run_ray_command(args: argparse.Namespace) -> None:
    import yaml  # imported here: only this command reads YAML (PyYAML comes with Ray)
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    if args.ray_command == "deploy":
        send_ray_token_if_saved(os.environ)
    from loraloom.platform.cli.admin import bootstrap_notice, prepare_database, shown_url
    from loraloom.platform.cli.options import load_settings
    from loraloom.platform.ray_serve.serve_runner import (
        DeployFailedError,
        config_schema,
        deploy_to_cluster,
        run_in_foreground,
    )

    if not args.config.is_file():
        sys.exit(f"loraloom ray: --config {args.config} not found; pass a Ray Serve config file "
                 f"(the repository has {DEFAULT_CONFIG} and deploy/ray/serve_config.cpu.yaml)")
    config = yaml.safe_load(args.config.read_text()) or {}
    try:
        config_schema(config)
    except ValidationError as error:
        sys.exit(f"loraloom ray: {args.config} is not a Ray Serve config: {error}")
    check_application_args(config)
    os.environ.update(config_settings_env(config))  # the file's settings win over the caller's, as in Ray
    settings = load_settings()
    refuse_unshareable(settings, args.ray_command)
    note = storage_note(settings)
    if note:
        print(note, file=sys.stderr)
    try:
        key_file = prepare_database(settings)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom ray: database {shown_url(settings.database_url)}: {error}")
    if key_file is not None:
        print(bootstrap_notice(key_file), file=sys.stderr)
    config = with_settings_env(config, shared_settings_env(dict(os.environ), settings))
    if args.ray_command == "deploy":
        deploy_to_cluster(config, args.address)
        print(f"loraloom ray: deployed {args.config} to {args.address}; `serve status` shows progress", file=sys.stderr)
        return
    if args.port is not None:
        config.setdefault("http_options", {})["port"] = args.port
    try:
        run_in_foreground(config, ray_address=os.environ.get("RAY_ADDRESS") or None)
    except DeployFailedError as error:
        sys.exit(f"loraloom ray: {error}")
