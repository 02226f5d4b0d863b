"""What the CLI commands that talk to a loraloom server over HTTP share (keys.py, adapters.py,
training.py): the client, the call that turns error responses into messages, pagination
and upload progress.

The server is LORALOOM_BASE_URL (default http://127.0.0.1:8000) and the key LORALOOM_API_KEY
(never taken on the command line, where shell history and `ps` would keep it). Results go
to stdout (a new key alone on its line, so `$(loraloom keys create ...)` captures it);
progress and messages go to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx
from tqdm import tqdm

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
BASE_URL_VARIABLE = "LORALOOM_BASE_URL"
API_KEY_VARIABLE = "LORALOOM_API_KEY"
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
            "wrote to <data dir>/bootstrap-admin-key on first start, or one from `loraloom admin create-key`)"
        )
    base_url = os.environ.get(BASE_URL_VARIABLE, DEFAULT_BASE_URL).rstrip("/")
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=TIMEOUT)


def call(client: httpx.Client, method: str, path: str, **request: Any) -> Any:
    """The JSON of a successful response; a CommandError with the server's message otherwise."""
    try:
        response = client.request(method, path, **request)
    except httpx.TransportError as error:
        raise CommandError(f"cannot reach {client.base_url} ({BASE_URL_VARIABLE}): {error}") from None
    raise_for_error(method, path, response)
    return response.json()


def raise_for_error(method: str, path: str, response: httpx.Response) -> None:
    """A CommandError with the server's message, unless the response is a success (read the body of
    a streamed response before calling this)."""
    if response.is_success:
        return
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


def pages(client: httpx.Client, path: str, cursor_of: str) -> Iterator[dict[str, Any]]:
    """Every item of a paginated list; `cursor_of` is the item field passed back as `after`."""
    params: dict[str, Any] = {"limit": PAGE_SIZE}
    while True:
        page = call(client, "GET", path, params=params)
        yield from page["data"]
        if not page["has_more"] or not page["data"]:
            return
        params["after"] = page["data"][-1][cursor_of]


Command = Callable[[httpx.Client, argparse.Namespace], None]


def run_command(commands: dict[tuple[str, str], Command], args: argparse.Namespace) -> None:
    """Run the command `args` names with a client for LORALOOM_BASE_URL; a CommandError ends it with status 1."""
    subcommand = getattr(args, f"{args.command}_command")
    try:
        with client_from_environment() as client:
            commands[(args.command, subcommand)](client, args)
    except CommandError as error:
        sys.exit(f"loraloom {args.command} {subcommand}: {error}")
