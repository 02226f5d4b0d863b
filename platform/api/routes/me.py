"""GET /v1/me: who the calling key is (its tenant, role and name), so a client such as the web
console can show it and decide which pages to offer without trying each one for a 403."""
from __future__ import annotations

import uuid
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from loraloom.platform.api.deps import CallerDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES
from loraloom.platform.db.models import ApiKey, ApiKeyRole

router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES)


class MeObject(BaseModel):
    object: Literal["api_key.self"] = "api_key.self"
    key_id: uuid.UUID
    key_name: str
    key_prefix: str
    role: ApiKeyRole
    tenant_id: uuid.UUID
    tenant: str = Field(description="The tenant's name.")
    operator: bool = Field(description="An admin key of tenant default: may list tenants and act on every tenant.")


@router.get("/v1/me", response_model=MeObject)
def get_me(caller: CallerDep, session: SessionDep) -> MeObject:
    """The calling API key, never its secret."""
    key = session.get(ApiKey, caller.api_key_id)  # authenticate found it usable a moment ago
    return MeObject(
        key_id=key.id, key_name=key.name, key_prefix=key.prefix, role=key.role,
        tenant_id=key.tenant_id, tenant=key.tenant.name, operator=caller.operator,
    )
