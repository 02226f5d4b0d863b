"""Adapter changes announced to every gateway on the database, in the transaction that makes them.

Each gateway caches what adapter references resolve to (registry/resolution.py). A change made
through one gateway clears that gateway's entries at once (the adapter routes call `invalidate`);
the other gateways on the same database learn of it from the database itself: on PostgreSQL the
changing transaction runs `pg_notify` on ADAPTER_CHANGES_CHANNEL, which PostgreSQL delivers to
every listening connection when the transaction commits, and never if it rolls back
(change_listener.py listens). SQLite has no such mechanism and is served by one process, whose
routes invalidate its cache themselves, so there an announcement does nothing.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

ADAPTER_CHANGES_CHANNEL = "loraloom_adapter_changes"


@dataclass(frozen=True)
class AdapterChange:
    """Something about one adapter of one tenant changed: a version, an alias, or the adapter itself."""

    tenant_id: uuid.UUID
    adapter_name: str

    def payload(self) -> str:
        # Well under NOTIFY's 8000-byte limit: a uuid and a name of at most 128 characters.
        return json.dumps({"tenant_id": str(self.tenant_id), "adapter": self.adapter_name})

    @classmethod
    def from_payload(cls, payload: str) -> "AdapterChange":
        """The change a notification names; ValueError if the payload is not one of ours."""
        try:
            fields = json.loads(payload)
            return cls(tenant_id=uuid.UUID(fields["tenant_id"]), adapter_name=str(fields["adapter"]))
        except (TypeError, KeyError, AttributeError, ValueError) as error:  # ValueError: bad JSON or uuid
            raise ValueError(f"not an adapter change notification: {payload[:200]!r}") from error


def announce_adapter_change(session: Session, *, tenant_id: uuid.UUID, adapter_name: str) -> None:
    """Tell every gateway on this database, when `session`'s transaction commits, that the adapter
    changed. Call it inside the changing transaction, before its commit."""
    if session.get_bind().dialect.name == "postgresql":
        change = AdapterChange(tenant_id=tenant_id, adapter_name=adapter_name)
        session.execute(select(func.pg_notify(ADAPTER_CHANGES_CHANNEL, change.payload())))
