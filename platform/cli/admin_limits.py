"""`loraloom admin limits`: read or change a tenant's (or one of its keys') rate limits and quotas
directly in the database, like `admin create-key` (no server needed; every gateway applies a change
from its next request). Only the limits named change; `none` removes one (unlimited). Prints the
limits as JSON on stdout."""
from __future__ import annotations

import argparse
import dataclasses
import json
import uuid
from typing import Any

from loraloom.platform.cli.options import positive_int

NONE = "none"
# flag -> the limit it sets (policy.Limits' field)
LIMIT_FLAGS = {
    "--rpm": "requests_per_minute",
    "--tpm": "tokens_per_minute",
    "--max-concurrent": "max_concurrent_requests",
    "--max-training-jobs": "max_training_jobs",
    "--monthly-tokens": "monthly_tokens",
}


def limit_value(text: str) -> int | None:
    """argparse type: a positive whole number, or `none` for unlimited."""
    return None if text.lower() == NONE else positive_int(text)


def weight_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0 (1 is the default share); got {text!r}")
    return value


def add_limits_command(admin_commands: Any) -> None:
    limits = admin_commands.add_parser(
        "limits", help="show or set a tenant's (or a key's) rate limits and quotas; prints them as JSON")
    limits.add_argument("--tenant", required=True, help="the tenant's name")
    limits.add_argument("--key", type=uuid.UUID, metavar="ID", help="a key id of that tenant: set the key's limits instead")
    for flag, name in LIMIT_FLAGS.items():
        limits.add_argument(flag, dest=name, type=limit_value, default=argparse.SUPPRESS, metavar="N",
                            help=f"{name.replace('_', ' ')}; {NONE!r}: unlimited")
    limits.add_argument("--weight", dest="share_weight", type=weight_value, default=argparse.SUPPRESS, metavar="W",
                        help="the tenant's fair-share weight in the engine (default 1)")


def admin_limits(settings: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Apply the flags given to the stored limits; returns the limits now in force."""
    from loraloom.platform.accounts.tenants import find_tenant
    from loraloom.platform.cli.database_state import require_migrated
    from loraloom.platform.db import create_db_engine, create_session_factory
    from loraloom.platform.db.models import ApiKey
    from loraloom.platform.limits.policy import (
        KEY_LIMIT_FIELDS,
        key_limits,
        set_key_limits,
        set_tenant_limits,
        tenant_limits,
    )

    require_migrated(settings.database_url)
    changes = {name: getattr(args, name) for name in (*LIMIT_FLAGS.values(), "share_weight") if hasattr(args, name)}
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            tenant = find_tenant(session, name=args.tenant)
            if args.key is None:
                limits = set_tenant_limits(session, tenant_id=tenant.id,
                                           limits=dataclasses.replace(tenant_limits(session, tenant.id), **changes))
                return {"tenant": tenant.name, **dataclasses.asdict(limits)}
            key = session.get(ApiKey, args.key)
            if key is None or key.tenant_id != tenant.id:
                raise LookupError(f"--key: tenant {tenant.name!r} has no key {args.key}; `loraloom keys list "
                                  f"--tenant {tenant.name}` lists them")
            limits = set_key_limits(session, key_id=key.id,
                                    limits=dataclasses.replace(key_limits(session, key.id), **changes))
            shown = {name: getattr(limits, name) for name in KEY_LIMIT_FIELDS}
            return {"tenant": tenant.name, "key_id": str(key.id), **shown}
    finally:
        engine.dispose()


def print_admin_limits(settings: Any, args: argparse.Namespace) -> None:
    print(json.dumps(admin_limits(settings, args), indent=2))
