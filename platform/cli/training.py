"""CLI commands for fine-tuning over HTTP: `loraloom files ...` and `loraloom jobs ...`.

`jobs follow` tails a job's events (oldest first, from a cursor) and draws a progress bar
of its steps with the latest loss (one line per step where stderr is not a terminal), until
the job ends; its exit status says how it ended. `jobs create`'s hyperparameter flags come
from the server's own Hyperparameters models (DPO's too), defaults included; it prints the
server's estimate of the job (tokens, steps, time) before it submits, and `--estimate` stops there.
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
from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters
from loraloom.platform.training.methods import DPO, METHODS, SUPERVISED
from loraloom.platform.training.promotion import ALWAYS, PROMOTE_WHEN, VALID_LOSS_IMPROVES

FOLLOW_POLL_S = 1.0
# Where `follow` stops: the job has ended, or rests until it is resumed.
AT_REST = ("succeeded", "failed", "cancelled", "paused")


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
    create.add_argument("--method", choices=METHODS, default=SUPERVISED,
                        help="supervised (chat, instruction or text files) or dpo (preference files). Default: "
                             f"{SUPERVISED}.")
    add_hyperparameter_flags(create)
    create.add_argument("--early-stopping-patience", type=positive_int, metavar="N",
                        help="stop after N evaluations without a better validation loss (needs --validation-file)")
    create.add_argument("--from-checkpoint", metavar="CHECKPOINT_ID",
                        help="start the LoRA weights from this checkpoint of one of your jobs (ftckpt-...)")
    create.add_argument("--metadata", type=key_value, action="append", metavar="KEY=VALUE",
                        help="a label kept with the job (repeatable, up to 16)")
    create.add_argument("--promote-alias", metavar="ALIAS",
                        help="on success, move this alias of the adapter (e.g. prod) to the job's version")
    create.add_argument("--promote-when", choices=PROMOTE_WHEN,
                        help=f"{VALID_LOSS_IMPROVES}: only if its validation loss is lower than the alias's version's "
                             f"(needs --validation-file); {ALWAYS}: unconditionally. Default: {VALID_LOSS_IMPROVES}.")
    create.add_argument("--estimate", action="store_true",
                        help="only print the server's estimate of the job (tokens, steps, time); create nothing")
    create.add_argument("--follow", action="store_true", help="then follow it like `jobs follow`")
    add_json_option(job_commands.add_parser("list", help="list your jobs"))
    for name, help_text in (("get", "show a job"), ("follow", "show a job's progress live until it ends or pauses"),
                            ("cancel", "cancel a job (a running one stops after its current step)"),
                            ("pause", "pause a job (a running one stops after its current step and saves a checkpoint)"),
                            ("resume", "resume a paused, failed or cancelled job from its last checkpoint")):
        command = job_commands.add_parser(name, help=help_text)
        command.add_argument("job_id", metavar="JOB_ID")


def comma_separated(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")]


def key_value(value: str) -> tuple[str, str]:
    key, equals, rest = value.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, rest


def positive_int_or_auto(value: str) -> int | str:
    return value if value == "auto" else positive_int(value)


def add_hyperparameter_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per hyperparameter, read off the models the server validates jobs with (DPO's adds its
    own), so that each help shows the default the server applies when the flag is left out."""
    for name, field in DpoHyperparameters.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            kind, shown = comma_separated, ",".join(default)
        elif default == "auto":
            kind, shown = positive_int_or_auto, default
        else:
            kind, shown = (positive_int if field.annotation is int else float), default
        only_dpo = " (--method dpo only.)" if name not in Hyperparameters.model_fields else ""
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind,
                            help=f"{field.description}{only_dpo} Default: {shown}.")


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


def create_body(client: httpx.Client, args: argparse.Namespace) -> dict[str, Any]:
    """The create body of the flags, in OpenAI's shape: the hyperparameters under method.<type>."""
    fields = DpoHyperparameters.model_fields if args.method == DPO else Hyperparameters.model_fields
    hyperparameters = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.method != DPO and getattr(args, "beta", None) is not None:
        raise CommandError("--beta is a DPO hyperparameter: add --method dpo")
    if args.promote_when is not None and args.promote_alias is None:
        raise CommandError("--promote-when says when to move --promote-alias: add --promote-alias ALIAS")
    promote = None
    if args.promote_alias is not None:
        promote = {"alias": args.promote_alias, **({"when": args.promote_when} if args.promote_when else {})}
    body = {
        "model": args.model or served_base(client),
        "training_file": args.training_file,
        "validation_file": args.validation_file,
        "suffix": args.suffix,
        "seed": args.seed,
        "method": {"type": args.method, args.method: {"hyperparameters": hyperparameters}},
        "early_stopping": None if args.early_stopping_patience is None else {"patience": args.early_stopping_patience},
        "from_checkpoint": args.from_checkpoint,
        "metadata": dict(args.metadata) if args.metadata else None,
        "promote": promote,
    }
    return {key: value for key, value in body.items() if value is not None}


def describe_estimate(estimate: dict[str, Any]) -> str:
    rate = "measured here" if estimate["rate_source"] == "measured" else "a default rate: no job has finished here yet"
    return (f"estimate: {estimate['trained_tokens']:,} trained tokens ({estimate['n_epochs']} epoch(s) of "
            f"{estimate['training_tokens']:,} + {estimate['evaluations']} evaluation(s) of "
            f"{estimate['validation_tokens']:,}), {estimate['total_steps']} steps, about "
            f"{format_duration(estimate['estimated_seconds'])} at {estimate['tokens_per_second']:,.0f} tokens/s ({rate})")


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def jobs_create(client: httpx.Client, args: argparse.Namespace) -> None:
    body = create_body(client, args)
    estimate = call(client, "POST", "/v1/fine_tuning/estimate", json=body)
    if args.estimate:
        print(describe_estimate(estimate))
        return
    print(describe_estimate(estimate), file=sys.stderr)
    job = call(client, "POST", "/v1/fine_tuning/jobs", json=body)
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
                  "trained_tokens", "attempts", "method", "early_stopping", "from_checkpoint", "promote", "metadata",
                  "metrics", "error"):
        print(f"{field}: {job[field]}")


def jobs_cancel(client: httpx.Client, args: argparse.Namespace) -> None:
    job = call(client, "POST", f"/v1/fine_tuning/jobs/{segment(args.job_id)}/cancel")
    print(f"{job['id']}: {job['status']}", file=sys.stderr)


def jobs_pause(client: httpx.Client, args: argparse.Namespace) -> None:
    job = call(client, "POST", f"/v1/fine_tuning/jobs/{segment(args.job_id)}/pause")
    print(f"{job['id']}: {job['status']}", file=sys.stderr)


def jobs_resume(client: httpx.Client, args: argparse.Namespace) -> None:
    job = call(client, "POST", f"/v1/fine_tuning/jobs/{segment(args.job_id)}/resume")
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
            if status in AT_REST:
                break
            time.sleep(FOLLOW_POLL_S)
    job = call(client, "GET", path)
    if job["status"] == "succeeded":
        print(f"{job_id} succeeded: {job['fine_tuned_model']}")
        return
    if job["status"] == "paused":  # not a failure: it waits for `jobs resume`
        print(f"{job_id} paused: `loraloom jobs resume {job_id}` continues it", file=sys.stderr)
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
    ("jobs", "pause"): jobs_pause,
    ("jobs", "resume"): jobs_resume,
}
