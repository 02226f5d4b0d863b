"""Tenants and API keys: POST/GET /v1/tenants, POST /v1/tenants/{tenant}/suspend and /resume,
POST/GET /v1/keys, DELETE /v1/keys/{key_id}.

Two kinds of admin: the operator (an admin key of tenant "default", the bootstrap key among
them) creates and lists tenants and acts on any tenant's keys; an admin key of any other tenant
manages its own tenant's keys only (naming another tenant is a 403, a key id of another tenant
a 404 like a missing one). A developer key may list its own tenant's keys. A new key's plaintext
is in the POST response and nowhere else, ever.
"""
from __future__ import annotations

import uuid

from fastapi import APIRouter

from loraloom.platform.accounts.keys import issue_key, list_keys, revoke_key
from loraloom.platform.accounts.tenants import create_tenant, list_tenants, set_suspended
from loraloom.platform.api.auth import tenant_in_scope
from loraloom.platform.api.deps import AdminDep, DeveloperDep, OperatorDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.api.schemas.admin import (
    CreatedKey,
    KeyCreate,
    KeyList,
    KeyObject,
    TenantCreate,
    TenantList,
    TenantObject,
    TenantPath,
)
from loraloom.platform.api.schemas.common import ErrorResponse, TenantQuery

router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES)
CONFLICT = {409: {"model": ErrorResponse}}


@router.post("/v1/tenants", status_code=201, response_model=TenantObject, responses=CONFLICT)
def create_tenant_route(body: TenantCreate, session: SessionDep, caller: OperatorDep) -> TenantObject:
    tenant = create_tenant(session, name=body.name)  # a name in use: TenantExistsError, a 409 (errors.py)
    session.commit()
    return TenantObject.of(tenant)


@router.get("/v1/tenants", response_model=TenantList)
def list_tenants_route(session: SessionDep, caller: OperatorDep) -> TenantList:
    return TenantList(data=[TenantObject.of(tenant) for tenant in list_tenants(session)])


@router.post("/v1/tenants/{tenant}/suspend", response_model=TenantObject, responses=CONFLICT)
def suspend_tenant_route(tenant: TenantPath, session: SessionDep, caller: OperatorDep) -> TenantObject:
    """Refuse every key of the tenant with 403 `tenant_suspended`; its open generations end within a second."""
    suspended = set_suspended(session, name=tenant, suspended=True)
    session.commit()
    return TenantObject.of(suspended)


@router.post("/v1/tenants/{tenant}/resume", response_model=TenantObject)
def resume_tenant_route(tenant: TenantPath, session: SessionDep, caller: OperatorDep) -> TenantObject:
    """Let the tenant's keys in again."""
    resumed = set_suspended(session, name=tenant, suspended=False)
    session.commit()
    return TenantObject.of(resumed)


@router.post("/v1/keys", status_code=201, response_model=CreatedKey)
def create_key_route(body: KeyCreate, session: SessionDep, caller: AdminDep) -> CreatedKey:
    tenant = tenant_in_scope(session, caller, body.tenant)
    key, plaintext = issue_key(session, tenant=tenant, name=body.name, role=body.role, expires_at=body.expires_at)
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
    key = revoke_key(session, key_id=key_id, tenant_id=None if caller.operator else caller.tenant_id)
    if key is None:
        raise APIError(404, f"key_id: no API key has the id {key_id}; GET /v1/keys lists them", code="key_not_found")
    session.commit()
    return KeyObject.of(key)
