"""CLI commands for fine-tuning over HTTP: `loraloom files ...` and `loraloom jobs ...`.

`jobs follow` tails a job's events (oldest first, from a cursor) and draws a progress bar
of its steps with the latest loss (one line per step where stderr is not a terminal), until
the job ends; its exit status says how it ended. `jobs create`'s hyperparameter flags come
from the server's own Hyperparameters model, defaults included.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import Any

import httpx
from tqdm import tqdm

from loraloom.platform.cli.http_client import Command, CommandError, ProgressReader, call, pages, segment
from loraloom.platform.cli.listing import add_json_option, field_columns, print_listing
from loraloom.platform.cli.options import positive_int
from loraloom.platform.training.hyperparameters import Hyperparameters

FOLLOW_POLL_S = 1.0
FINISHED = ("succeeded", "failed", "cancelled")


def add_commands(commands: argparse._SubParsersAction) -> None:
    files = commands.add_parser("files", help="training files (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    file_commands = files.add_subparsers(dest="files_command", required=True)
    upload = file_commands.add_parser("upload", help="upload a JSONL dataset; prints its file id")
    upload.add_argument("path", metavar="FILE")
    upload.add_argument("--purpose", default="fine-tune")
    add_json_option(file_commands.add_parser("list", help="list your files"))
    remove = file_commands.add_parser("rm", help="delete a file")
    remove.add_argument("file_id", metavar="FILE_ID")

    jobs = commands.add_parser("jobs", help="fine-tuning jobs (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    job_commands = jobs.add_subparsers(dest="jobs_command", required=True)
    create = job_commands.add_parser("create", help="start a fine-tuning job; prints its id")
    create.add_argument("--training-file", required=True, metavar="FILE_ID")
    create.add_argument("--validation-file", metavar="FILE_ID")
    create.add_argument("--suffix", help="adapter name the result is registered under; default: a new one, ft-<8 hex digits>")
    create.add_argument("--model", help="the base model; default: the one the server serves")
    create.add_argument("--seed", type=int)
    add_hyperparameter_flags(create)
    create.add_argument("--follow", action="store_true", help="then follow it like `jobs follow`")
    add_json_option(job_commands.add_parser("list", help="list your jobs"))
    for name, help_text in (("get", "show a job"), ("follow", "show a job's progress live until it ends"),
                            ("cancel", "cancel a job (a running one stops after its current step)")):
        command = job_commands.add_parser(name, help=help_text)
        command.add_argument("job_id", metavar="JOB_ID")


def comma_separated(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def add_hyperparameter_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per hyperparameter, read off the model the server validates jobs with, so that each
    help shows the default the server applies when the flag is left out."""
    for name, field in Hyperparameters.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            kind, shown = comma_separated, ",".join(default)
        else:
            kind, shown = (positive_int if field.annotation is int else float), default
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind,
                            help=f"{field.description} Default: {shown}.")


# ------------------------------------------------------------------ files
def files_upload(client: httpx.Client, args: argparse.Namespace) -> None:
    try:
        file = open(args.path, "rb")
    except OSError as error:
        raise CommandError(f"{args.path}: {error.strerror}") from None
    with file, tqdm(total=_size(file), unit="B", unit_scale=True, unit_divisor=1024, desc=f"upload {args.path}",
                    file=sys.stderr) as bar:
        uploaded = call(client, "POST", "/v1/files", data={"purpose": args.purpose},
                        files={"file": (args.path.rsplit("/", 1)[-1], ProgressReader(file, bar), "application/jsonl")})
    print(f"{uploaded['line_count']} examples, {uploaded['token_count']} tokens ({uploaded['format']} format)",
          file=sys.stderr)
    print(uploaded["id"])


def _size(file: Any) -> int:
    file.seek(0, 2)
    size = file.tell()
    file.seek(0)
    return size


def files_list(client: httpx.Client, args: argparse.Namespace) -> None:
    print_listing(args, pages(client, "/v1/files", "id"), field_columns(
        ("ID", "id"), ("FILENAME", "filename"), ("FORMAT", "format"), ("LINES", "line_count"),
        ("TOKENS", "token_count"), ("BYTES", "bytes"),
    ))


def files_rm(client: httpx.Client, args: argparse.Namespace) -> None:
    deleted = call(client, "DELETE", f"/v1/files/{segment(args.file_id)}")
    print(f"deleted {deleted['id']}", file=sys.stderr)


# ------------------------------------------------------------------ jobs
def served_base(client: httpx.Client) -> str:
    models = call(client, "GET", "/v1/models")["data"]
    return next(model["id"] for model in models if model.get("parent") is None)


def jobs_create(client: httpx.Client, args: argparse.Namespace) -> None:
    hyperparameters = {name: getattr(args, name) for name in Hyperparameters.model_fields
                       if getattr(args, name) is not None}
    body = {
        "model": args.model or served_base(client),
        "training_file": args.training_file,
        "validation_file": args.validation_file,
        "suffix": args.suffix,
        "seed": args.seed,
        "hyperparameters": hyperparameters,
    }
    job = call(client, "POST", "/v1/fine_tuning/jobs", json={k: v for k, v in body.items() if v is not None})
    print(job["id"])
    if args.follow:
        follow(client, job["id"])


def jobs_list(client: httpx.Client, args: argparse.Namespace) -> None:
    print_listing(args, pages(client, "/v1/fine_tuning/jobs", "id"), [
        *field_columns(("ID", "id"), ("STATUS", "status"), ("SUFFIX", "suffix"), ("FINE-TUNED MODEL", "fine_tuned_model"),
                       ("TRAINING FILE", "training_file")),
        ("CREATED", lambda j: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(j["created_at"]))),
    ])


def jobs_get(client: httpx.Client, args: argparse.Namespace) -> None:
    job = call(client, "GET", f"/v1/fine_tuning/jobs/{segment(args.job_id)}")
    for field in ("id", "status", "model", "suffix", "fine_tuned_model", "training_file", "validation_file", "seed",
                  "trained_tokens", "attempts", "hyperparameters", "metrics", "error"):
        print(f"{field}: {job[field]}")


def jobs_cancel(client: httpx.Client, args: argparse.Namespace) -> None:
    job = call(client, "POST", f"/v1/fine_tuning/jobs/{segment(args.job_id)}/cancel")
    print(f"{job['id']}: {job['status']}", file=sys.stderr)


def jobs_follow(client: httpx.Client, args: argparse.Namespace) -> None:
    follow(client, args.job_id)


def follow(client: httpx.Client, job_id: str) -> None:
    """Print the job's messages and move a step bar with the loss until the job ends."""
    path = f"/v1/fine_tuning/jobs/{segment(job_id)}"
    after: str | None = None
    with step_bar(job_id) as bar:
        while True:
            status = call(client, "GET", path)["status"]  # read before the events: none is missed at the end
            while True:
                params = {"order": "asc", "limit": 100, **({"after": after} if after else {})}
                page = call(client, "GET", f"{path}/events", params=params)
                for event in page["data"]:
                    _show(bar, event)
                    after = event["id"]
                if not page["has_more"]:
                    break
            if status in FINISHED:
                break
            time.sleep(FOLLOW_POLL_S)
    job = call(client, "GET", path)
    if job["status"] == "succeeded":
        print(f"{job_id} succeeded: {job['fine_tuned_model']}")
        return
    error = job.get("error") or {}
    raise CommandError(f"{job_id} {job['status']}" + (f": [{error['code']}] {error['message']}" if error else ""))


def step_bar(job_id: str) -> tqdm:
    """The step bar, as wide as the terminal (shutil's answer: COLUMNS, else the terminal's size, else
    80 columns when neither is known). Off where stderr is no terminal (a pipe, a CI log): there each
    step is a line of its own (_show), not a redraw with carriage returns."""
    return tqdm(total=None, unit="step", desc=job_id, file=sys.stderr, ncols=shutil.get_terminal_size().columns,
                disable=not sys.stderr.isatty())


def _show(bar: tqdm, event: dict[str, Any]) -> None:
    data = event.get("data") or {}
    if event["type"] == "metrics" and "step" in data:
        bar.total = data.get("total_steps")
        bar.n = data["step"]
        postfix = {"loss": f"{data['train_loss']:.4f}"}
        if "eval_loss" in data:
            postfix["eval_loss"] = f"{data['eval_loss']:.4f}"
        if "eta_seconds" in data:
            postfix["eta"] = f"{data['eta_seconds']:.0f}s"
        if bar.disable:
            bar.write(f"step {bar.n}/{bar.total} " + " ".join(f"{key}={value}" for key, value in postfix.items()),
                      file=sys.stderr)
            return
        bar.set_postfix(postfix, refresh=False)
        bar.refresh()
    else:
        bar.write(f"[{event['level']}] {event['message']}", file=sys.stderr)


COMMANDS: dict[tuple[str, str], Command] = {
    ("files", "upload"): files_upload,
    ("files", "list"): files_list,
    ("files", "rm"): files_rm,
    ("jobs", "create"): jobs_create,
    ("jobs", "list"): jobs_list,
    ("jobs", "get"): jobs_get,
    ("jobs", "follow"): jobs_follow,
    ("jobs", "cancel"): jobs_cancel,
}
