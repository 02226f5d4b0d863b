"""Row locks that hold on SQLite too.

PostgreSQL locks the selected rows (SELECT ... FOR UPDATE) until the transaction ends. SQLite
ignores FOR UPDATE, and its Python driver opens a transaction only at the first write, so the
reads before a write run outside any transaction: two requests could both read an alias's version
and both write from it (a history that no longer chains). On SQLite `for_update` first makes the
transaction the database's writer with a write that changes nothing; SQLite allows one writer at a
time, so from there on the transaction reads the latest commit and nobody else writes until it
ends: a lock on the whole file, which is what a single-process SQLite deployment can afford.
"""
from __future__ import annotations

from typing import TypeVar

from sqlalchemy import Select, delete, false
from sqlalchemy.orm import Session

from loraloom.platform.db.models import BlobLock

StatementT = TypeVar("StatementT", bound=Select)


def for_update(session: Session, statement: StatementT) -> StatementT:
    """`statement` locking the rows it selects; call it right before executing the statement."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(delete(BlobLock).where(false()))  # any table would do: the write is what counts
    return statement.with_for_update()
