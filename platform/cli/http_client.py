"""CLI commands that talk to a loraloom server over HTTP: `loraloom keys ...` and `loraloom adapters ...`
(`files` and `jobs` are in cli_training.py).

The server is LORALOOM_BASE_URL (default http://127.0.0.1:8000) and the key LORALOOM_API_KEY
(never taken on the command line, where shell history and `ps` would keep it). Results go
to stdout (a new key alone on its line, so `$(loraloom keys create ...)` captures it);
progress and messages go to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx
from tqdm import tqdm

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
BASE_URL_VARIABLE = "LORALOOM_BASE_URL"
API_KEY_VARIABLE = "LORALOOM_API_KEY"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
PAGE_SIZE = 100
# Connecting and sending are quick; the server validates an uploaded adapter before it answers.
TIMEOUT = httpx.Timeout(60.0, read=600.0)


class CommandError(Exception):
    """Ends the command with this message on stderr and exit status 1."""


def client_from_environment() -> httpx.Client:
    api_key = os.environ.get(API_KEY_VARIABLE, "").strip()
    if not api_key:
        raise CommandError(
            f"{API_KEY_VARIABLE} is not set; export the API key (e.g. the admin key `loraloom serve` "
            "printed on first start, or one from `loraloom admin create-key`)"
        )
    base_url = os.environ.get(BASE_URL_VARIABLE, DEFAULT_BASE_URL).rstrip("/")
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=TIMEOUT)


def call(client: httpx.Client, method: str, path: str, **request: Any) -> Any:
    """The JSON of a successful response; a CommandError with the server's message otherwise."""
    try:
        response = client.request(method, path, **request)
    except httpx.TransportError as error:
        raise CommandError(f"cannot reach {client.base_url} ({BASE_URL_VARIABLE}): {error}") from None
    if response.is_success:
        return response.json()
    try:
        error = response.json()["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:500]
    else:  # a refused dataset: every reported line, not just the summary
        report = (error.get("details") or {}).get("report") or {}
        message += "".join(
            f"\n  line {item['line']}: {item['message']}" if item["line"] is not None else f"\n  {item['message']}"
            for item in report.get("errors", [])
        )
    raise CommandError(f"{method} {path}: {response.status_code} {message}")


def segment(value: str) -> str:
    """A user-given name as one URL path segment."""
    return quote(value, safe="")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    for row in cells:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())


# ------------------------------------------------------------------ keys
def keys_create(client: httpx.Client, args: argparse.Namespace) -> None:
    body = {"name": args.name, "role": args.role, "tenant": args.tenant, "expires_at": args.expires_at}
    created = call(client, "POST", "/v1/keys", json={k: v for k, v in body.items() if v is not None})
    print(f"created {created['role']} key {created['prefix']}... (id {created['id']}); it is shown only now",
          file=sys.stderr)
    print(created["key"])


def keys_list(client: httpx.Client, args: argparse.Namespace) -> None:
    params = {} if args.tenant is None else {"tenant": args.tenant}
    keys = call(client, "GET", "/v1/keys", params=params)["data"]
    print_table(
        ["ID", "PREFIX", "NAME", "ROLE", "CREATED", "LAST USED", "REVOKED"],
        [[k["id"], k["prefix"], k["name"], k["role"], k["created_at"], k["last_used_at"], k["revoked_at"]]
         for k in keys],
    )


def keys_revoke(client: httpx.Client, args: argparse.Namespace) -> None:
    revoked = call(client, "DELETE", f"/v1/keys/{segment(args.key_id)}")
    print(f"revoked {revoked['prefix']}... ({revoked['id']}) at {revoked['revoked_at']}")


# ------------------------------------------------------------------ adapters
class ProgressReader:
    """A file that advances a progress bar as it is read. httpx sizes the upload from
    fileno() (so the request has a Content-Length) and reads it in chunks."""

    def __init__(self, file: BinaryIO, bar: tqdm) -> None:
        self.file = file
        self.bar = bar

    def fileno(self) -> int:
        return self.file.fileno()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self.file.seek(offset, whence)
        self.bar.n = position  # httpx rewinds before sending: the bar follows
        return position

    def tell(self) -> int:
        return self.file.tell()

    def read(self, size: int = -1) -> bytes:
        chunk = self.file.read(size)
        self.bar.update(len(chunk))
        return chunk


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


def pages(client: httpx.Client, path: str, cursor_of: str) -> Iterator[dict[str, Any]]:
    """Every item of a paginated list; `cursor_of` is the item field passed back as `after`."""
    params: dict[str, Any] = {"limit": PAGE_SIZE}
    while True:
        page = call(client, "GET", path, params=params)
        yield from page["data"]
        if not page["has_more"] or not page["data"]:
            return
        params["after"] = page["data"][-1][cursor_of]


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


COMMANDS = {
    ("keys", "create"): keys_create,
    ("keys", "list"): keys_list,
    ("keys", "revoke"): keys_revoke,
    ("adapters", "push"): adapters_push,
    ("adapters", "list"): adapters_list,
    ("adapters", "versions"): adapters_versions,
    ("adapters", "promote"): adapters_promote,
    ("adapters", "rm"): adapters_rm,
}


def run_client_command(args: argparse.Namespace) -> None:
    from loraloom.platform.cli_training import TRAINING_COMMANDS

    subcommand = getattr(args, f"{args.command}_command")
    try:
        with client_from_environment() as client:
            {**COMMANDS, **TRAINING_COMMANDS}[(args.command, subcommand)](client, args)
    except CommandError as error:
        sys.exit(f"loraloom {args.command} {subcommand}: {error}")
