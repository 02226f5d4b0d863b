"""Tenants and API keys (/v1/tenants, /v1/keys). A new key's plaintext is in CreatedKey only."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import Path
from pydantic import AwareDatetime, BaseModel, Field

from loraloom.platform.accounts.tenants import TENANT_NAME
from loraloom.platform.api.schemas.common import ListObject, StrictBody, documented_pattern
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant


# A tenant's name in a path; a name no tenant has is a 404 naming `tenant`.
TenantPath = Annotated[str, Path(description="The tenant's name.", json_schema_extra=documented_pattern(TENANT_NAME))]


class TenantCreate(StrictBody):
    # Checked by accounts/tenants.py, whose message says what is wrong; the document states the same rule.
    name: str = Field(description="1-64 lowercase letters, digits, '-' or '_'.", json_schema_extra=documented_pattern(TENANT_NAME))


class TenantObject(BaseModel):
    id: uuid.UUID
    object: Literal["tenant"] = "tenant"
    name: str
    created_at: datetime
    suspended_at: datetime | None = Field(
        description="When the operator suspended the tenant (its keys are refused with 403); null when active."
    )

    @classmethod
    def of(cls, tenant: Tenant) -> TenantObject:
        return cls(id=tenant.id, name=tenant.name, created_at=tenant.created_at, suspended_at=tenant.suspended_at)


class TenantList(ListObject[TenantObject]):
    pass


class KeyCreate(StrictBody):
    name: str = Field(min_length=1, max_length=128, description="What the key is for, e.g. 'ci' or 'support-bot'.")
    role: ApiKeyRole = Field(
        description="admin: everything in its tenant (in tenant default: the operator, every tenant); "
        "developer: adapters and training; inference: only that."
    )
    tenant: str | None = Field(
        default=None, description="The tenant's name (the operator's keys only). Default: the calling key's tenant."
    )
    expires_at: AwareDatetime | None = Field(default=None, description="Never expires when omitted.")


class KeyObject(BaseModel):
    """An API key as listed: the visible prefix, never the key."""

    id: uuid.UUID
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str
    role: ApiKeyRole
    tenant_id: uuid.UUID
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, key: ApiKey) -> KeyObject:
        return cls(
            id=key.id,
            name=key.name,
            prefix=key.prefix,
            role=key.role,
            tenant_id=key.tenant_id,
            created_at=key.created_at,
            expires_at=key.expires_at,
            revoked_at=key.revoked_at,
            last_used_at=key.last_used_at,
        )


class CreatedKey(KeyObject):
    key: str = Field(description="The API key. Shown this once: store it now, it cannot be read back.")


class KeyList(ListObject[KeyObject]):
    pass
