"""`loraloom keys ...`: API keys over HTTP (creating and revoking need an admin key)."""
from __future__ import annotations

import argparse
import sys

import httpx

from loraloom.platform.cli.http_client import Command, call, segment
from loraloom.platform.cli.listing import add_json_option, field_columns, print_listing
from loraloom.platform.cli.options import ROLE_CHOICES


def add_commands(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser("keys", help="API keys (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create a key (admin); prints only the key on stdout")
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument("--role", required=True, choices=ROLE_CHOICES)
    create.add_argument("--tenant", help="tenant name; default: your key's tenant")
    create.add_argument("--expires-at", help="ISO 8601 time with offset, e.g. 2027-01-01T00:00:00Z")
    listing = key_commands.add_parser("list", help="list keys: prefix, role, last use (never the key)")
    listing.add_argument("--tenant", help="tenant name (admin); default: your key's tenant")
    add_json_option(listing)
    revoke = key_commands.add_parser("revoke", help="revoke a key by id (admin)")
    revoke.add_argument("key_id", metavar="KEY_ID")


def keys_create(client: httpx.Client, args: argparse.Namespace) -> None:
    body = {"name": args.name, "role": args.role, "tenant": args.tenant, "expires_at": args.expires_at}
    created = call(client, "POST", "/v1/keys", json={k: v for k, v in body.items() if v is not None})
    print(f"created {created['role']} key {created['prefix']}... (id {created['id']}); it is shown only now",
          file=sys.stderr)
    print(created["key"])


def keys_list(client: httpx.Client, args: argparse.Namespace) -> None:
    params = {} if args.tenant is None else {"tenant": args.tenant}
    keys = call(client, "GET", "/v1/keys", params=params)["data"]
    print_listing(args, keys, field_columns(
        ("ID", "id"), ("PREFIX", "prefix"), ("NAME", "name"), ("ROLE", "role"), ("CREATED", "created_at"),
        ("LAST USED", "last_used_at"), ("REVOKED", "revoked_at"),
    ))


def keys_revoke(client: httpx.Client, args: argparse.Namespace) -> None:
    revoked = call(client, "DELETE", f"/v1/keys/{segment(args.key_id)}")
    print(f"revoked {revoked['prefix']}... ({revoked['id']}) at {revoked['revoked_at']}")


COMMANDS: dict[tuple[str, str], Command] = {
    ("keys", "create"): keys_create,
    ("keys", "list"): keys_list,
    ("keys", "revoke"): keys_revoke,
}
