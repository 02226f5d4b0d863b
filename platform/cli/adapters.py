"""`loraloom adapters ...`: the adapter registry over HTTP (push, list, versions, promote, rm)."""
from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx
from tqdm import tqdm

from loraloom.platform.cli.http_client import Command, CommandError, ProgressReader, call, pages, print_table, segment
from loraloom.platform.cli.options import positive_int

# What a PEFT adapter directory must hold (the client checks before it uploads anything).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def add_commands(commands: argparse._SubParsersAction) -> None:
    adapters = commands.add_parser("adapters", help="adapters (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    adapter_commands = adapters.add_subparsers(dest="adapters_command", required=True)
    push = adapter_commands.add_parser(
        "push", help="upload a PEFT adapter directory (or a .tar.gz/.zip of one) as a new version"
    )
    push.add_argument("path", type=Path, metavar="DIR")
    push.add_argument("--name", required=True, help="adapter name; created on its first push")
    push.add_argument("--alias", help="also point this alias (e.g. prod) at the new version")
    adapter_commands.add_parser("list", help="list adapters")
    versions = adapter_commands.add_parser("versions", help="list an adapter's versions")
    versions.add_argument("name", metavar="NAME")
    promote = adapter_commands.add_parser("promote", help="point ALIAS of NAME at VERSION (promote or roll back)")
    promote.add_argument("name", metavar="NAME")
    promote.add_argument("alias", metavar="ALIAS")
    promote.add_argument("version", type=positive_int, metavar="VERSION")
    remove = adapter_commands.add_parser("rm", help="delete an adapter (NAME) or one version (NAME@N)")
    remove.add_argument("reference", metavar="NAME|NAME@N")
    remove.add_argument("--force", action="store_true", help="delete a version even if an alias points to it")


def upload_paths(path: Path) -> list[Path]:
    """A PEFT adapter directory's two files, or the archive file itself."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CommandError(f"{path}: no such file or directory")
    missing = [name for name in ADAPTER_FILES if not (path / name).is_file()]
    if missing:
        raise CommandError(
            f"{path}: missing {', '.join(missing)}; push a PEFT adapter directory "
            f"({' + '.join(ADAPTER_FILES)}) or a .tar.gz/.zip of one"
        )
    return [path / name for name in ADAPTER_FILES]


def adapters_push(client: httpx.Client, args: argparse.Namespace) -> None:
    paths = upload_paths(args.path)
    total = sum(path.stat().st_size for path in paths)
    with ExitStack() as stack:
        bar = stack.enter_context(
            tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"push {args.name}", file=sys.stderr)
        )
        files = [
            ("files", (path.name, ProgressReader(stack.enter_context(path.open("rb")), bar), "application/octet-stream"))
            for path in paths
        ]
        version = call(client, "POST", f"/v1/adapters/{segment(args.name)}/versions", files=files)
    print(f"{args.name}@{version['version']}")
    if args.alias is not None:
        move_alias(client, args.name, args.alias, version["version"])


def move_alias(client: httpx.Client, name: str, alias: str, version: int) -> None:
    moved = call(client, "PUT", f"/v1/adapters/{segment(name)}/aliases/{segment(alias)}", json={"version": version})
    print(f"{name}:{moved['alias']} -> {name}@{moved['version']}", file=sys.stderr)


def adapters_list(client: httpx.Client, args: argparse.Namespace) -> None:
    print_table(
        ["NAME", "ALIASES", "UPDATED"],
        [
            [a["name"], " ".join(f"{alias}={v}" for alias, v in sorted(a["aliases"].items())), a["updated_at"]]
            for a in pages(client, "/v1/adapters", "name")
        ],
    )


def adapters_versions(client: httpx.Client, args: argparse.Namespace) -> None:
    print_table(
        ["VERSION", "STATUS", "RANK", "ALPHA", "ALIASES", "CREATED"],
        [
            [v["version"], v["status"], v["rank"], v["alpha"], " ".join(v["aliases"]), v["created_at"]]
            for v in pages(client, f"/v1/adapters/{segment(args.name)}/versions", "version")
        ],
    )


def adapters_promote(client: httpx.Client, args: argparse.Namespace) -> None:
    move_alias(client, args.name, args.alias, args.version)


def adapters_rm(client: httpx.Client, args: argparse.Namespace) -> None:
    name, separator, number = args.reference.partition("@")
    if not separator:
        path, params = f"/v1/adapters/{segment(name)}", {}
    elif number.isdigit():
        path, params = f"/v1/adapters/{segment(name)}/versions/{number}", {"force": str(args.force).lower()}
    else:
        raise CommandError(f"{args.reference!r}: expected NAME or NAME@VERSION, e.g. support-bot@3")
    deleted = call(client, "DELETE", path, params=params)
    print(f"deleted {deleted['id']}", file=sys.stderr)


COMMANDS: dict[tuple[str, str], Command] = {
    ("adapters", "push"): adapters_push,
    ("adapters", "list"): adapters_list,
    ("adapters", "versions"): adapters_versions,
    ("adapters", "promote"): adapters_promote,
    ("adapters", "rm"): adapters_rm,
}
