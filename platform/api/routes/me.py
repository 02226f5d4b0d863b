"""GET /v1/me: who the calling key is (its tenant, role and name), so a client such as the web
console can show it and decide which pages to offer without trying each one for a 403; and the
limits the key is held to (its tenant's and its own) with what is left of each now."""
from __future__ import annotations

import uuid
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from loraloom.platform.api.deps import CallerDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES
from loraloom.platform.api.schemas.limits import (
    CallerLimitsObject,
    KeyLimitsObject,
    LimitsLeft,
    LimitState,
    TenantLimitsObject,
)
from loraloom.platform.db.models import ApiKey, ApiKeyRole, utcnow
from loraloom.platform.limits.admission import Headroom, Who
from loraloom.platform.limits.limiter import LimiterUnavailableError
from loraloom.platform.limits.policy import UNLIMITED, CallerLimits

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
    limits: CallerLimitsObject = Field(
        description="The limits this key is held to (null: unlimited), its tenant's and its own, and what is left "
                    "of each now.")


def _states(rooms: dict[str, object]) -> dict[str, LimitState]:
    return {name: LimitState(limit=room.limit, remaining=room.remaining, reset_seconds=round(room.reset_s, 3))
            for name, room in rooms.items() if isinstance(room, Headroom)}


@router.get("/v1/me", response_model=MeObject)
async def get_me(caller: CallerDep, session: SessionDep, request: Request) -> MeObject:
    """The calling API key, never its secret."""
    key = await run_in_threadpool(session.get, ApiKey, caller.api_key_id)  # authenticate found it a moment ago
    limits: CallerLimits = getattr(request.state, "caller_limits", None) or CallerLimits(UNLIMITED, UNLIMITED)
    try:
        left = await request.app.state.rate_limits.gate.remaining(
            Who(tenant_id=caller.tenant_id, api_key_id=caller.api_key_id), limits, utcnow())
    except LimiterUnavailableError:
        left = {}  # the counters' store is down: the limits are known, what is left of them is not
    tenant_limits = TenantLimitsObject.of(caller.tenant_name, limits.tenant)
    key_limits = KeyLimitsObject.of(key.id, limits.key)
    return MeObject(
        key_id=key.id, key_name=key.name, key_prefix=key.prefix, role=key.role,
        tenant_id=key.tenant_id, tenant=caller.tenant_name, operator=caller.operator,
        limits=CallerLimitsObject(
            tenant=tenant_limits, key=key_limits,
            remaining=LimitsLeft(tenant=_states(left.get("tenant", {})), key=_states(left.get("key", {}))),
        ),
    )
