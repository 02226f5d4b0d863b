"""`loraloom ray run|deploy`: loraloom on Ray Serve (platform/ray_serve), from a Serve config file
(deploy/ray/serve_config.yaml). It prepares the database the config names, as `serve` does (migrations,
the bootstrap admin key written to a file), then hands the file to Ray's own `serve run` or `serve deploy`,
so the file means exactly what Ray Serve's documentation says it means."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_CONFIG = Path("deploy/ray/serve_config.yaml")
SETTINGS_PREFIX = "LORALOOM_"


def add_ray_command(commands: argparse._SubParsersAction) -> None:
    ray = commands.add_parser("ray", help="serve on Ray Serve: engine replicas with adapter affinity, gateways in front")
    verbs = ray.add_subparsers(dest="ray_command", required=True)
    for verb, help_text in (("run", "start a local Ray cluster (or join RAY_ADDRESS) and serve in the foreground"),
                            ("deploy", "deploy onto a running Ray cluster and return")):
        command = verbs.add_parser(verb, help=help_text)
        command.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                             help=f"Ray Serve config file (default: {DEFAULT_CONFIG})")
        if verb == "deploy":
            command.add_argument("--address", help="the cluster's dashboard address (default: Ray's, http://localhost:8265)")


def config_settings_env(config: dict) -> dict[str, str]:
    """The LORALOOM_* variables the config's applications set in their runtime_env: the settings the
    gateways and replicas will have, hence the database to prepare."""
    found: dict[str, str] = {}
    for application in config.get("applications") or []:
        env_vars = ((application.get("runtime_env") or {}).get("env_vars")) or {}
        found.update({name: str(value) for name, value in env_vars.items() if name.startswith(SETTINGS_PREFIX)})
    return found


def run_ray_command(args: argparse.Namespace) -> None:
    import yaml  # imported here: only this command reads YAML (PyYAML comes with Ray)
    from sqlalchemy.exc import SQLAlchemyError

    from loraloom.platform.cli.admin import bootstrap_notice, prepare_database, shown_url
    from loraloom.platform.cli.options import load_settings

    if not args.config.is_file():
        sys.exit(f"loraloom ray: --config {args.config} not found; pass a Ray Serve config file "
                 f"(the repository has {DEFAULT_CONFIG})")
    config = yaml.safe_load(args.config.read_text()) or {}
    os.environ.update(config_settings_env(config))  # the settings below, and `serve run`'s local cluster, use them
    settings = load_settings()
    try:
        key_file = prepare_database(settings)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom ray: database {shown_url(settings.database_url)}: {error}")
    if key_file is not None:
        print(bootstrap_notice(key_file), file=sys.stderr)
    serve_args = [sys.executable, "-m", "ray.serve.scripts", args.ray_command, str(args.config)]
    if args.ray_command == "deploy" and args.address:
        serve_args += ["--address", args.address]
    os.execv(sys.executable, serve_args)
