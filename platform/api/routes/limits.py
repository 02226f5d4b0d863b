"""Rate limits and quotas, set by the operator: GET/PUT /v1/tenants/{tenant}/limits and
GET/PUT /v1/keys/{key_id}/limits. A PUT replaces every limit of its scope (a field left out becomes
unlimited) and applies from the next request, on every gateway (limits are read with the key).
A tenant reads its own limits, and what is left of them, in GET /v1/me."""
from __future__ import annotations

import uuid

from fastapi import APIRouter

from loraloom.platform.accounts.tenants import find_tenant
from loraloom.platform.api.deps import OperatorDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES, APIError
from loraloom.platform.api.schemas.admin import TenantPath
from loraloom.platform.api.schemas.limits import KeyLimitsBody, KeyLimitsObject, TenantLimitsBody, TenantLimitsObject
from loraloom.platform.db.models import ApiKey
from loraloom.platform.limits.policy import key_limits, set_key_limits, set_tenant_limits, tenant_limits

router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES)


def _key(session: SessionDep, key_id: uuid.UUID) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise APIError(404, f"key_id: no API key has the id {key_id}; GET /v1/keys lists them", param="key_id",
                       code="key_not_found")
    return key


@router.get("/v1/tenants/{tenant}/limits", response_model=TenantLimitsObject)
def get_tenant_limits(tenant: TenantPath, session: SessionDep, caller: OperatorDep) -> TenantLimitsObject:
    row = find_tenant(session, name=tenant)  # none of that name: a 404
    return TenantLimitsObject.of(row.name, tenant_limits(session, row.id))


@router.put("/v1/tenants/{tenant}/limits", response_model=TenantLimitsObject)
def put_tenant_limits(
    tenant: TenantPath, body: TenantLimitsBody, session: SessionDep, caller: OperatorDep
) -> TenantLimitsObject:
    row = find_tenant(session, name=tenant)
    limits = set_tenant_limits(session, tenant_id=row.id, limits=body.limits())
    session.commit()
    return TenantLimitsObject.of(row.name, limits)


@router.get("/v1/keys/{key_id}/limits", response_model=KeyLimitsObject)
def get_key_limits(key_id: uuid.UUID, session: SessionDep, caller: OperatorDep) -> KeyLimitsObject:
    return KeyLimitsObject.of(_key(session, key_id).id, key_limits(session, key_id))


@router.put("/v1/keys/{key_id}/limits", response_model=KeyLimitsObject)
def put_key_limits(key_id: uuid.UUID, body: KeyLimitsBody, session: SessionDep, caller: OperatorDep) -> KeyLimitsObject:
    limits = set_key_limits(session, key_id=_key(session, key_id).id, limits=body.limits())
    session.commit()
    return KeyLimitsObject.of(key_id, limits)
