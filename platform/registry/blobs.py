"""Storing and collecting content-addressed blobs safely beside other writers of the same bytes.

`claimed_blobs` wraps an operation that stores blobs and then commits a row referencing them
(an upload, a training file, a checkpoint): its blobs count as referenced throughout, and if it
fails, those nothing else references are collected, so a failure leaves no new blob behind.
`collect_blob` deletes one blob if nothing references it. Both go through db/blob_references.py's
lock, so a deletion of one version can never take bytes that another upload is registering.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from loraloom.platform.db.blob_references import blob_referenced, claim_blobs, lock_blob, release_claims
from loraloom.platform.storage import BlobStore, content_key


@contextmanager
def claimed_blobs(session: Session, store: BlobStore, sha256s: Iterable[str]) -> Iterator[None]:
    """Claim the blobs before the body stores them; release them after it (which must commit the
    rows that reference them); on failure, collect those that nothing else holds."""
    digests = sorted(set(sha256s))
    claims = claim_blobs(session, digests)
    try:
        yield
    except BaseException:
        session.rollback()
        release_claims(session, claims)
        for sha256 in digests:
            collect_blob(session, store, sha256)
        raise
    release_claims(session, claims)


def collect_blob(session: Session, store: BlobStore, sha256: str) -> bool:
    """Delete the blob if no version, checkpoint, training file or claim of any tenant holds it;
    returns whether it was deleted. The lock is held until the storage deletion is done."""
    lock_blob(session, sha256)
    try:
        if blob_referenced(session, sha256):
            return False
        store.delete(content_key(sha256))
        return True
    finally:
        session.commit()
