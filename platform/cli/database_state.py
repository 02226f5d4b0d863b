"""Whether the configured database is at this version's schema: what every CLI command that works on
the database checks first (admin.py, admin_limits.py, `loraloom db check`), and how a database URL is
shown in messages (never with its password)."""
from __future__ import annotations

import time
from typing import TextIO

from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from loraloom.platform.db import database_revision
from loraloom.platform.db.migrate import MIGRATIONS_DIR


class DatabaseNotReadyError(RuntimeError):
    """The database is not at the latest migration: the CLI says how to fix it."""


def shown_url(database_url: str) -> str:
    return make_url(database_url).render_as_string(hide_password=True)


class DatabaseTooNewError(DatabaseNotReadyError):
    """The database was migrated by a newer version of loraloom: waiting will not help."""


def require_migrated(database_url: str) -> str:
    """The head revision, which the database is at; else raise, saying how to fix it."""
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    head = scripts.get_current_head()
    current = database_revision(database_url)
    if current is not None and current not in {script.revision for script in scripts.walk_revisions()}:
        raise DatabaseTooNewError(
            f"the database at {shown_url(database_url)} is at revision {current}, which this version of "
            f"loraloom does not know (its newest is {head}): run the version that migrated it"
        )
    if current != head:
        raise DatabaseNotReadyError(
            f"the database at {shown_url(database_url)} is at revision {current or 'none (empty)'}, "
            f"not {head}; run `loraloom db upgrade` first"
        )
    return head


def wait_until_migrated(database_url: str, *, wait_s: float, progress: TextIO, poll_s: float = 2.0) -> str:
    """The head revision once the database is at it, polling for up to `wait_s` seconds.

    What a Kubernetes pod's init container runs (deploy/kubernetes): one migration Job upgrades the
    schema, and the pods of the new version wait for it instead of starting on an old schema. A
    database not reachable yet (PostgreSQL still starting) is waited for too; at the deadline the
    last reason is raised. Why it waits is written once to `progress`, for `kubectl logs`."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            return require_migrated(database_url)
        except DatabaseTooNewError:
            raise
        except (DatabaseNotReadyError, SQLAlchemyError) as error:
            reason = (str(error) if isinstance(error, DatabaseNotReadyError)
                      else f"database {shown_url(database_url)}: {error}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DatabaseNotReadyError(reason) from error
            if not told:
                progress.write(f"waiting up to {wait_s:g} s: {reason}\n")
                progress.flush()
                told = True
            time.sleep(min(poll_s, remaining))
