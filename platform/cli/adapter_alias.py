"""`loraloom adapters alias ...`: point an alias at a version or split it between versions by weight
(a canary rollout), then promote the split or roll it back; `show` prints the alias and its history."""
from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx

from loraloom.platform.cli.http_client import CommandError, call, segment
from loraloom.platform.cli.options import positive_int


def split_argument(value: str) -> list[dict[str, int]]:
    """argparse type of --split: VERSION=WEIGHT,VERSION=WEIGHT,... (e.g. 3=90,4=10)."""
    shares = []
    for part in value.split(","):
        version, separator, weight = part.strip().partition("=")
        if not separator or not version.strip().isdigit() or not weight.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"expected VERSION=WEIGHT,VERSION=WEIGHT (e.g. 3=90,4=10: 90% on version 3, 10% on 4), got {value!r}"
            )
        shares.append({"version": int(version), "weight": int(weight)})
    return shares


def add_alias_command(adapter_commands: argparse._SubParsersAction) -> None:
    alias = adapter_commands.add_parser("alias", help="point, split, promote or roll back an alias (e.g. prod)")
    alias_commands = alias.add_subparsers(dest="alias_command", required=True)
    set_ = alias_commands.add_parser("set", help="point ALIAS of NAME at one VERSION, or split it with --split")
    _name_and_alias(set_)
    target = set_.add_mutually_exclusive_group(required=True)
    target.add_argument("version", type=positive_int, metavar="VERSION", nargs="?", help="the one version to name")
    target.add_argument("--split", type=split_argument, metavar="V=W,V=W",
                        help="split the alias's requests by weight, e.g. 3=90,4=10 (a request's `user` keeps its "
                        "version while the split stays the same)")
    promote = alias_commands.add_parser("promote", help="end the split on one version (by default its newest)")
    _name_and_alias(promote)
    promote.add_argument("--version", type=positive_int, help="the split's version to keep (default: the newest)")
    _name_and_alias(alias_commands.add_parser("rollback", help="end the split on the version named before it"))
    _name_and_alias(alias_commands.add_parser("show", help="the alias, its split and its history"))


def _name_and_alias(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("alias", metavar="ALIAS")


def describe_alias(alias: dict[str, Any]) -> str:
    """`bot:prod -> bot@3`, or with a split `bot:prod -> bot@3 (90), bot@4 (10)`."""
    name = alias["adapter"]
    if alias.get("split"):
        targets = ", ".join(f"{name}@{share['version']} ({share['weight']})" for share in alias["split"])
    else:
        targets = f"{name}@{alias['version']}"
    return f"{name}:{alias['alias']} -> {targets}"


def adapters_alias(client: httpx.Client, args: argparse.Namespace) -> None:
    path = f"/v1/adapters/{segment(args.name)}/aliases/{segment(args.alias)}"
    if args.alias_command == "set":
        body = {"split": args.split} if args.split is not None else {"version": args.version}
        alias = call(client, "PUT", path, json=body)
    elif args.alias_command == "promote":
        alias = call(client, "POST", f"{path}/promote", json={} if args.version is None else {"version": args.version})
    elif args.alias_command == "rollback":
        alias = call(client, "POST", f"{path}/rollback")
    elif args.alias_command == "show":
        print(describe_alias(call(client, "GET", path)))
        for move in call(client, "GET", f"{path}/history")["data"]:
            print(f"{move['changed_at']}  {move['action']:<8}  {_history_target(args.name, move)}{_promotion(move)}")
        return
    else:
        raise CommandError(f"unknown alias command {args.alias_command!r}")
    print(describe_alias(alias), file=sys.stderr)


def _promotion(move: dict[str, Any]) -> str:
    """A job's promotion: the job, and a gate's comparison of validation losses."""
    if move.get("training_job_id") is None:
        return ""
    gate = move.get("gate")
    if gate is None:
        return f"  (job {move['training_job_id']})"
    current = "none" if gate["current_valid_loss"] is None else f"{gate['current_valid_loss']:.4f}"
    return (f"  (job {move['training_job_id']}: version {gate['new_version']} valid_loss {gate['new_valid_loss']:.4f}"
            f" against {current})")


def _history_target(name: str, move: dict[str, Any]) -> str:
    if move.get("split"):
        return ", ".join(f"{name}@{share['version']} ({share['weight']})" for share in move["split"])
    return "-" if move["to_version"] is None else f"{name}@{move['to_version']}"
