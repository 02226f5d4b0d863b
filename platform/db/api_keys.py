"""API key minting and lookup. The plaintext key is returned once, at creation, and never stored.

Keys carry 256 random bits, so a single fast sha256 is enough: there is nothing to
brute-force (unlike passwords, which need a slow salted hash), and a deterministic hash
lets a request's key be found with one indexed lookup.
"""
from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant

KEY_SCHEME = "ll-"  # recognizable in logs and by secret scanners
VISIBLE_PREFIX_CHARS = len(KEY_SCHEME) + 8


def hash_api_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_api_key(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    name: str,
    role: ApiKeyRole,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Add a new key to the session; returns the row and the plaintext to show the user once."""
    plaintext = KEY_SCHEME + secrets.token_urlsafe(32)
    key = ApiKey(
        tenant_id=tenant_id,
        name=name,
        role=role,
        prefix=plaintext[:VISIBLE_PREFIX_CHARS],
        key_hash=hash_api_key(plaintext),
        expires_at=expires_at,
    )
    session.add(key)
    return key, plaintext


def find_api_key(session: Session, plaintext: str) -> ApiKey | None:
    """The key row for a presented bearer token, revoked or not (the caller checks is_usable), with its
    tenant loaded in the same query: whether the key is the operator's depends on the tenant. The key's
    and the tenant's limits come in that query too (outer joins): every request needs them."""
    return session.scalar(
        select(ApiKey).where(ApiKey.key_hash == hash_api_key(plaintext)).options(
            joinedload(ApiKey.tenant).joinedload(Tenant.limits), joinedload(ApiKey.limits)
        )
    )
