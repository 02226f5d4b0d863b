"""`loraloom adapters pull NAME[@N|:ALIAS] DIR`: an adapter version back as a PEFT directory.

The server lists the version's files with a URL, size and sha256 each (GET .../download): on S3
storage the weights come straight from the bucket by a presigned URL, everything else through
the API. DIR appears whole or not at all: the files are written into a hidden folder beside it,
checked against their sha256, and only then renamed to DIR, so an interrupted pull never leaves
a half-written adapter where a loader would take it for a whole one.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from tqdm import tqdm

from loraloom.platform.cli.http_client import TIMEOUT, CommandError, call, raise_for_error, segment
from loraloom.platform.registry.references import parse_reference

CHUNK_BYTES = 1024 * 1024


def add_pull_command(adapter_commands: argparse._SubParsersAction) -> None:
    pull = adapter_commands.add_parser(
        "pull", help="download a version as a PEFT directory (adapter_config.json + adapter_model.safetensors)"
    )
    pull.add_argument("reference", metavar="NAME[@N|:ALIAS]",
                      help="support-bot (latest), support-bot@3, support-bot:prod, or a job's result_files entry")
    pull.add_argument("path", type=Path, metavar="DIR", help="the folder to create")
    pull.add_argument("--force", action="store_true", help="replace DIR even when it is not empty")


def adapters_pull(client: httpx.Client, args: argparse.Namespace) -> None:
    reference = parse_reference(args.reference)
    if reference is None:
        raise CommandError(
            f"NAME: {args.reference!r} is not an adapter reference; use NAME, NAME@N or NAME:ALIAS "
            "(e.g. support-bot, support-bot@3, support-bot:prod)"
        )
    target = args.path.absolute()
    _check_target(target, force=args.force)
    name = reference.name
    number = reference.version
    if number is None:  # an alias (`latest` for a bare name): pull the version it points at now
        alias = call(client, "GET", f"/v1/adapters/{segment(name)}/aliases/{segment(reference.target_alias)}")
        number = alias["version"]
    download = call(client, "GET", f"/v1/adapters/{segment(name)}/versions/{number}/download")
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial"))
    try:
        total = sum(file["size_bytes"] for file in download["files"])
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"pull {name}@{number}",
                  file=sys.stderr) as bar:
            for file in download["files"]:
                _fetch(client, file, staged / file["filename"], bar)
        _install(staged, target)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    print(f"{name}@{number}")
    print(f"pulled {name}@{number} into {target}", file=sys.stderr)


def _check_target(target: Path, *, force: bool) -> None:
    """Refuse before downloading anything: DIR must be new, an empty folder, or replaced by --force."""
    if target.exists() and not target.is_dir():
        raise CommandError(f"DIR: {target} is a file; give the path of a folder to create")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise CommandError(
            f"DIR: {target} exists and is not empty; pull into a new folder, or pass --force to replace it"
        )


def _fetch(client: httpx.Client, file: dict[str, Any], dest: Path, bar: tqdm) -> None:
    """Download one listed file to `dest`, checking its size and sha256."""
    url = file["url"]
    on_api = url.startswith("/")
    # A path is this API's (the client sends the key); a full URL is presigned storage, which
    # must get no Authorization header: it would leak the key, and S3 refuses two signatures.
    shown = url if on_api else urlsplit(url)._replace(query="").geturl()  # no signature in messages
    digest = hashlib.sha256()
    size = 0
    try:
        with client.stream("GET", url) if on_api else httpx.stream("GET", url, timeout=TIMEOUT) as response:
            if not response.is_success:
                response.read()
                raise_for_error("GET", shown, response)
            with dest.open("wb") as out:
                for chunk in response.iter_bytes(CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    bar.update(len(chunk))
    except httpx.TransportError as error:
        raise CommandError(f"GET {shown}: the download failed ({error}); run the pull again") from None
    if (size, digest.hexdigest()) != (file["size_bytes"], file["sha256"]):
        raise CommandError(
            f"{file['filename']}: got {size} bytes with sha256 {digest.hexdigest()}, but the server listed "
            f"{file['size_bytes']} bytes with sha256 {file['sha256']}; run the pull again"
        )


def _install(staged: Path, target: Path) -> None:
    """Rename the finished folder to DIR; what DIR held before (--force) goes only once it is replaced."""
    if not target.is_dir() or not any(target.iterdir()):
        staged.replace(target)  # a rename; an empty folder in the way is replaced with it
        return
    previous = target.with_name(f".{target.name}.replaced-{uuid.uuid4().hex[:8]}")
    target.rename(previous)
    staged.rename(target)
    shutil.rmtree(previous, ignore_errors=True)
