"""The `loraloom` command line: the parser and the dispatch. Each command group lives in a module
of its own; this one only puts them together (and holds the three one-line commands)."""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from loraloom.platform.cli import adapters, keys, training
from loraloom.platform.cli.admin_limits import add_limits_command
from loraloom.platform.cli.http_client import run_command
from loraloom.platform.cli.options import ROLE_CHOICES, load_settings
from loraloom.platform.cli.ray_command import add_ray_command, run_ray_command
from loraloom.platform.cli.serve import add_serve_command, add_worker_command, run_worker_command, serve

HTTP_COMMANDS = {**keys.COMMANDS, **adapters.COMMANDS, **training.COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraloom", description="Multi-LoRA LLM serving.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)

    model = commands.add_parser("model", help="manage models")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    import_bundled = model_commands.add_parser(
        "import-bundled", help="convert the bundled SmolLM2-135M-Instruct once; print its directory"
    )
    import_bundled.add_argument("--force", action="store_true", help="convert again even if already imported")

    # db and admin run in admin.py, which imports the database layer: only those commands pay for it.
    db = commands.add_parser("db", help="manage the database (LORALOOM_DATABASE_URL)")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_commands.add_parser("upgrade", help="apply the migrations (serve also does this on start)")
    check = db_commands.add_parser(
        "check", help="exit 0 when the database is at this version's newest migration, else say why and exit 1"
    )
    check.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="keep checking for this long (a pod waiting for the migration Job)")

    add_worker_command(commands)
    add_ray_command(commands)

    admin = commands.add_parser("admin", help="administer the database directly, without a server")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)
    create_key = admin_commands.add_parser(
        "create-key", help="create an API key (and its tenant if new); prints only the key on stdout"
    )
    create_key.add_argument("--tenant", required=True, help="tenant name; created if it does not exist")
    create_key.add_argument("--role", required=True, choices=ROLE_CHOICES)
    create_key.add_argument("--name", default="cli", help="what the key is for")
    add_limits_command(admin_commands)

    keys.add_commands(commands)
    adapters.add_commands(commands)
    training.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        if len({name for name, _ in args.adapter}) != len(args.adapter):
            parser.error("--adapter: each NAME may be given once")
        serve(args)
    elif args.command == "worker":
        run_worker_command(args)
    elif args.command == "ray":
        run_ray_command(args)
    elif args.command == "model":
        from loraloom.engine import import_bundled  # imported here: it needs torch

        print(import_bundled(force=args.force))
    elif args.command in ("db", "admin"):
        from loraloom.platform.cli.admin import run_admin_command  # imported here: the database layer is slow

        run_admin_command(args, load_settings())
    else:
        run_command(HTTP_COMMANDS, args)

