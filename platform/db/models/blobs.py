"""What keeps content-addressed blobs safe from garbage collection while they are being referenced
(platform/db/blob_references.py)."""
from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from loraloom.platform.db.models.base import Base, utcnow


class BlobLock(Base):
    """One row per blob that was ever claimed or collected: the row both take a lock on, so that
    "is this blob referenced? then delete it" (collection) and "this blob is about to be referenced"
    (a claim) never interleave. Rows stay: deleting a lock row would let a waiter lock nothing."""

    __tablename__ = "blob_locks"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)


class BlobClaim(Base):
    """A blob some operation is storing and will reference once it commits (an upload being
    registered, a training file, a checkpoint): collection keeps the blob meanwhile. Claims are
    released when the operation ends; one left by a killed process stops counting after
    blob_references.CLAIM_TTL."""

    __tablename__ = "blob_claims"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
