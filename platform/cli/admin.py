"""CLI commands that work on the configured database directly, with no server:
`loraloom db upgrade`, `loraloom db check`, `loraloom admin create-key`, `loraloom admin limits`
(admin_limits.py), and what `loraloom serve` does to the database before it starts (migrations, the
bootstrap admin key)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from loraloom.platform.accounts.keys import create_bootstrap_admin_key, create_key_for_tenant
from loraloom.platform.accounts.tenants import DEFAULT_TENANT
from loraloom.platform.cli.database_state import (DatabaseNotReadyError, require_migrated, shown_url,
                                                  wait_until_migrated)
from loraloom.platform.db import create_db_engine, create_session_factory, database_revision, upgrade_database
from loraloom.platform.db.models import ApiKeyRole
from loraloom.platform.settings import Settings


def db_upgrade(settings: Settings) -> str:
    """Apply the migrations; returns the revision the database is now at."""
    upgrade_database(settings.database_url)
    revision = database_revision(settings.database_url)
    assert revision is not None, "upgrade_database leaves the database at a revision"
    return revision


def admin_create_key(settings: Settings, *, tenant: str, role: ApiKeyRole, name: str) -> str:
    """Create an API key directly in the database (creating the tenant if needed); returns the
    plaintext key. For the first key of a deployment, or to recover from lost admin keys."""
    require_migrated(settings.database_url)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            _, plaintext = create_key_for_tenant(session, tenant_name=tenant, key_name=name, role=role)
    finally:
        engine.dispose()
    return plaintext


BOOTSTRAP_KEY_FILE = "bootstrap-admin-key"  # under the data directory


def bootstrap_key_file(settings: Settings) -> Path:
    return settings.data_dir / BOOTSTRAP_KEY_FILE


def bootstrap_notice(key_file: Path) -> str:
    """What a first start tells the operator: where the key is, never the key (stderr is what log
    shippers collect)."""
    return (f"First start: created tenant {DEFAULT_TENANT!r} and its admin API key, written to {key_file} "
            f"(mode 0600; stored in the database only as a hash). Use it: export LORALOOM_API_KEY=$(cat {key_file}); "
            "then move it somewhere safe and delete the file. Lost it? "
            f"`loraloom admin create-key --tenant {DEFAULT_TENANT} --role admin` makes another.")


def write_secret_file(path: Path, secret: str) -> None:
    """`secret` alone in `path`, readable by this user only (0600 from its creation: never a moment
    with wider permissions); an older file there is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)  # an existing file keeps its mode through os.open: set it
        file.write(secret + "\n")


def prepare_database(settings: Settings) -> Path | None:
    """What `loraloom serve` does first: migrate, then on a database that never had an admin key,
    create one and write it to bootstrap_key_file; returns that file, or None when no key was made.
    The caller announces the file (bootstrap_notice)."""
    upgrade_database(settings.database_url)
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            key = create_bootstrap_admin_key(session)
            if key is not None:  # written inside the transaction: a key whose file failed is not kept
                write_secret_file(bootstrap_key_file(settings), key)
    finally:
        engine.dispose()
    return None if key is None else bootstrap_key_file(settings)


def run_admin_command(args: argparse.Namespace, settings: Settings) -> None:
    """`loraloom db ...` and `loraloom admin ...`: results on stdout, everything else on stderr."""
    try:
        if args.command == "db" and args.db_command == "check":
            revision = wait_until_migrated(settings.database_url, wait_s=args.wait, progress=sys.stderr)
            print(f"database {shown_url(settings.database_url)} is at revision {revision}", file=sys.stderr)
        elif args.command == "db":
            revision = db_upgrade(settings)
            print(f"database {shown_url(settings.database_url)} is at revision {revision}", file=sys.stderr)
        elif args.admin_command == "limits":
            from loraloom.platform.cli.admin_limits import print_admin_limits

            print_admin_limits(settings, args)
        else:
            print(admin_create_key(settings, tenant=args.tenant, role=ApiKeyRole(args.role), name=args.name))
    except (DatabaseNotReadyError, ValueError, LookupError) as error:
        sys.exit(f"loraloom {args.command}: {error}")
    except SQLAlchemyError as error:
        sys.exit(f"loraloom {args.command}: database {shown_url(settings.database_url)}: {error}")
