"""`loraloom adapters ...`: the adapter registry over HTTP (push, pull, list, versions, promote, alias, rm)."""
from __future__ import annotations

import argparse
import operator
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx
from tqdm import tqdm

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_FILES, ADAPTER_WEIGHTS_FILE
from loraloom.platform.cli.adapter_alias import add_alias_command, adapters_alias
from loraloom.platform.cli.adapter_pull import add_pull_command, adapters_pull
from loraloom.platform.cli.http_client import Command, CommandError, ProgressReader, call, pages, segment
from loraloom.platform.cli.listing import add_json_option, field_columns, print_listing
from loraloom.platform.cli.options import positive_int

# adapter_model.safetensors, .bin, .pt...: whatever format the weights were saved in.
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
ADAPTER_WEIGHTS_STEM = ADAPTER_WEIGHTS_FILE.split(".")[0] + "."


def add_commands(commands: argparse._SubParsersAction) -> None:
    adapters = commands.add_parser("adapters", help="adapters (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    adapter_commands = adapters.add_subparsers(dest="adapters_command", required=True)
    push = adapter_commands.add_parser(
        "push", help="upload a PEFT adapter directory (or a .tar.gz/.zip of one) as a new version"
    )
    push.add_argument("path", type=Path, metavar="DIR")
    push.add_argument("--name", required=True, help="adapter name; created on its first push")
    push.add_argument("--alias", help="also point this alias (e.g. prod) at the new version")
    add_pull_command(adapter_commands)
    add_json_option(adapter_commands.add_parser("list", help="list adapters"))
    versions = adapter_commands.add_parser("versions", help="list an adapter's versions")
    versions.add_argument("name", metavar="NAME")
    add_json_option(versions)
    promote = adapter_commands.add_parser("promote", help="point ALIAS of NAME at VERSION (promote or roll back)")
    promote.add_argument("name", metavar="NAME")
    promote.add_argument("alias", metavar="ALIAS")
    promote.add_argument("version", type=positive_int, metavar="VERSION")
    add_alias_command(adapter_commands)
    remove = adapter_commands.add_parser("rm", help="delete an adapter (NAME) or one version (NAME@N)")
    remove.add_argument("reference", metavar="NAME|NAME@N")
    remove.add_argument("--force", action="store_true",
                        help="delete even while an alias other than latest points at it (the aliases go too)")


def upload_paths(path: Path) -> list[Path]:
    """An archive file itself; from a directory, its two PEFT files (and chat template). A directory without both sends
    the adapter files it has (adapter_config.json, adapter_model.*) as they are: the server judges
    them, and its message (e.g. why a pickled adapter_model.bin is refused) reaches the user as is."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise CommandError(f"{path}: no such file or directory")
    if all((path / name).is_file() for name in ADAPTER_FILES):
        # With its own chat template when it has one (transformers writes either file; the server keeps one).
        templates = [path / name for name in TEMPLATE_FILES if (path / name).is_file()]
        return [path / name for name in ADAPTER_FILES] + templates
    found = sorted(file for file in path.iterdir() if file.is_file() and (
        file.name == ADAPTER_CONFIG_FILE or file.name.startswith(ADAPTER_WEIGHTS_STEM)))
    if not found:
        raise CommandError(
            f"{path}: no adapter files there; push a PEFT adapter directory ({' + '.join(ADAPTER_FILES)}) "
            "or a .tar.gz/.zip of one"
        )
    return found


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
    if version.get("deduplicated"):
        print(f"{args.name}@{version['version']} already holds these files: no new version was made", file=sys.stderr)
    if version.get("base_model_warning"):
        print(f"warning: {version['base_model_warning']}", file=sys.stderr)
    if args.alias is not None:
        move_alias(client, args.name, args.alias, version["version"])


def move_alias(client: httpx.Client, name: str, alias: str, version: int) -> None:
    moved = call(client, "PUT", f"/v1/adapters/{segment(name)}/aliases/{segment(alias)}", json={"version": version})
    print(f"{name}:{moved['alias']} -> {name}@{moved['version']}", file=sys.stderr)


def adapters_list(client: httpx.Client, args: argparse.Namespace) -> None:
    print_listing(args, pages(client, "/v1/adapters", "name"), [
        ("NAME", operator.itemgetter("name")),
        ("ALIASES", lambda a: " ".join(f"{alias}={v}" for alias, v in sorted(a["aliases"].items()))),
        ("UPDATED", operator.itemgetter("updated_at")),
    ])


def adapters_versions(client: httpx.Client, args: argparse.Namespace) -> None:
    print_listing(args, pages(client, f"/v1/adapters/{segment(args.name)}/versions", "version"), [
        *field_columns(("VERSION", "version"), ("STATUS", "status"), ("RANK", "rank"), ("ALPHA", "alpha")),
        ("ALIASES", lambda v: " ".join(v["aliases"])),
        ("CREATED", operator.itemgetter("created_at")),
    ])


def adapters_promote(client: httpx.Client, args: argparse.Namespace) -> None:
    move_alias(client, args.name, args.alias, args.version)


def adapters_rm(client: httpx.Client, args: argparse.Namespace) -> None:
    name, separator, number = args.reference.partition("@")
    if not separator:
        path, params = f"/v1/adapters/{segment(name)}", {"force": str(args.force).lower()}
    elif number.isdigit():
        path, params = f"/v1/adapters/{segment(name)}/versions/{number}", {"force": str(args.force).lower()}
    else:
        raise CommandError(f"{args.reference!r}: expected NAME or NAME@VERSION, e.g. support-bot@3")
    deleted = call(client, "DELETE", path, params=params)
    print(f"deleted {deleted['id']}", file=sys.stderr)


COMMANDS: dict[tuple[str, str], Command] = {
    ("adapters", "push"): adapters_push,
    ("adapters", "pull"): adapters_pull,
    ("adapters", "list"): adapters_list,
    ("adapters", "versions"): adapters_versions,
    ("adapters", "promote"): adapters_promote,
    ("adapters", "alias"): adapters_alias,
    ("adapters", "rm"): adapters_rm,
}
