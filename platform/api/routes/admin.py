"""Tenants and API keys: POST/GET /v1/tenants, POST/GET /v1/keys, DELETE /v1/keys/{key_id}.

Admin keys act server-wide (they are the operators); a developer key may list its own
tenant's keys. A new key's plaintext is in the POST response and nowhere else, ever.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, Field

from loraloom.platform.accounts.keys import issue_key, list_keys, revoke_key
from loraloom.platform.accounts.tenants import TenantExistsError, create_tenant, list_tenants
from loraloom.platform.api.auth import tenant_in_scope
from loraloom.platform.api.deps import AdminDep, DeveloperDep, SessionDep, TenantQuery
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError, field_error
from loraloom.platform.api.schemas import ListObject, StrictBody
from loraloom.platform.db.models import ApiKey, ApiKeyRole, Tenant

router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES)

class TenantCreate(StrictBody):
    name: str = Field(description="1-64 lowercase letters, digits, '-' or '_'.")


class TenantObject(BaseModel):
    id: uuid.UUID
    object: Literal["tenant"] = "tenant"
    name: str
    created_at: datetime

    @classmethod
    def of(cls, tenant: Tenant) -> TenantObject:
        return cls(id=tenant.id, name=tenant.name, created_at=tenant.created_at)


class TenantList(ListObject[TenantObject]):
    pass


class KeyCreate(StrictBody):
    name: str = Field(min_length=1, max_length=128, description="What the key is for, e.g. 'ci' or 'support-bot'.")
    role: ApiKeyRole = Field(description="admin: everything; developer: adapters and training; inference: only that.")
    tenant: str | None = Field(default=None, description="The tenant's name. Default: the calling key's tenant.")
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


@router.post("/v1/tenants", status_code=201, response_model=TenantObject)
def create_tenant_route(body: TenantCreate, session: SessionDep, caller: AdminDep) -> TenantObject:
    try:
        tenant = create_tenant(session, name=body.name)
    except TenantExistsError as error:
        raise APIError(409, str(error), param="name", code="tenant_exists") from None
    except ValueError as error:
        raise field_error(error, {}) from None
    session.commit()
    return TenantObject.of(tenant)


@router.get("/v1/tenants", response_model=TenantList)
def list_tenants_route(session: SessionDep, caller: AdminDep) -> TenantList:
    return TenantList(data=[TenantObject.of(tenant) for tenant in list_tenants(session)])


@router.post("/v1/keys", status_code=201, response_model=CreatedKey)
def create_key_route(body: KeyCreate, session: SessionDep, caller: AdminDep) -> CreatedKey:
    tenant = tenant_in_scope(session, caller, body.tenant)
    try:
        key, plaintext = issue_key(session, tenant=tenant, name=body.name, role=body.role, expires_at=body.expires_at)
    except ValueError as error:
        raise field_error(error, {}) from None
    session.commit()
    return CreatedKey(**KeyObject.of(key).model_dump(), key=plaintext)


@router.get("/v1/keys", response_model=KeyList)
def list_keys_route(
    session: SessionDep,
    caller: DeveloperDep,
    tenant: TenantQuery = None,
) -> KeyList:
    scope = tenant_in_scope(session, caller, tenant)
    return KeyList(data=[KeyObject.of(key) for key in list_keys(session, tenant_id=scope.id)])


@router.delete("/v1/keys/{key_id}", response_model=KeyObject)
def revoke_key_route(key_id: uuid.UUID, session: SessionDep, caller: AdminDep) -> KeyObject:
    """Revoke a key: every later request with it is refused with 401."""
    key = revoke_key(session, key_id=key_id)
    if key is None:
        raise APIError(404, f"key_id: no API key has the id {key_id}; GET /v1/keys lists them", code="key_not_found")
    session.commit()
    return KeyObject.of(key)
