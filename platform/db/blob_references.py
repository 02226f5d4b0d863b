"""Whether a content-addressed blob is still needed. The same bytes are shared by versions,
checkpoints and training files, of any tenant, and by operations that are storing them right now
(claims): a blob may go only when none of them holds it. Every deletion that collects blobs asks
here, so no kind of reference can be forgotten by one.

Collection ("nothing references it, so delete it") and a claim ("about to reference it") both
lock the blob's row in blob_locks first, so one never runs between the other's check and act:
either the claim commits first and collection sees it, or collection finishes first and the
claimer stores the bytes again.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import delete, exists, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from loraloom.platform.db.locking import for_update
from loraloom.platform.db.models import (
    AdapterVersion,
    AdapterVersionFile,
    AdapterVersionStatus,
    BlobClaim,
    BlobLock,
    FineTuningCheckpoint,
    TrainingFile,
    utcnow,
)

# A claim stops counting after this long: its process was killed between storing the bytes and
# committing the row that references them (no upload or checkpoint takes near this long).
CLAIM_TTL = timedelta(hours=6)


def lock_blob(session: Session, sha256: str) -> None:
    """Take the blob's lock row until the transaction ends (db/locking.py)."""
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    session.execute(insert(BlobLock).values(sha256=sha256).on_conflict_do_nothing())
    session.execute(for_update(session, select(BlobLock.sha256).where(BlobLock.sha256 == sha256)))


def claim_blobs(session: Session, sha256s: Iterable[str]) -> list[uuid.UUID]:
    """Record that this operation is storing these blobs; committed before it stores them."""
    claims = []
    for sha256 in sorted(set(sha256s)):  # one order everywhere: two claimers never deadlock
        lock_blob(session, sha256)
        claim = BlobClaim(sha256=sha256)
        session.add(claim)
        session.flush()
        claims.append(claim.id)
    session.commit()
    return claims


def release_claims(session: Session, claims: list[uuid.UUID]) -> None:
    session.execute(delete(BlobClaim).where(BlobClaim.id.in_(claims)))
    session.commit()


def blob_referenced(session: Session, sha256: str) -> bool:
    """Whether a version not deleted (pending, ready or failed), a checkpoint (its files or its
    training state), a training file or a live claim, of any tenant, holds the blob `sha256`."""
    references = (
        exists().where(
            AdapterVersionFile.sha256 == sha256,
            AdapterVersionFile.version_id == AdapterVersion.id,
            AdapterVersion.status != AdapterVersionStatus.deleted,
        ),
        exists().where(
            or_(
                FineTuningCheckpoint.weights_sha256 == sha256,
                FineTuningCheckpoint.config_sha256 == sha256,
                FineTuningCheckpoint.training_state_sha256 == sha256,
            )
        ),
        exists().where(TrainingFile.sha256 == sha256),
        exists().where(BlobClaim.sha256 == sha256, BlobClaim.created_at > utcnow() - CLAIM_TTL),
    )
    return any(session.scalar(select(reference)) for reference in references)
