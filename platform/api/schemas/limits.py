"""Rate limits and quotas (/v1/tenants/{tenant}/limits, /v1/keys/{key_id}/limits, and /v1/me's view).
Every limit is optional: null means unlimited."""
from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictFloat, StrictInt

from loraloom.platform.api.schemas.common import JSON_INTEGER, StrictBody
from loraloom.platform.db.models import MAX_INT64
from loraloom.platform.limits.policy import Limits

LimitValue = Annotated[StrictInt, Field(ge=1, le=MAX_INT64), JSON_INTEGER] | None


def _limit(description: str) -> object:
    return Field(default=None, description=f"{description} null: unlimited.")


class KeyLimitsBody(StrictBody):
    """A key's limits, all replaced by a PUT: a field left out becomes unlimited."""

    requests_per_minute: LimitValue = _limit("Requests per minute.")  # type: ignore[assignment]
    tokens_per_minute: LimitValue = _limit(  # type: ignore[assignment]
        "Tokens per minute: a request costs its prompt plus max_tokens x n when admitted, trued up to what "
        "it used when it ends.")
    max_concurrent_requests: LimitValue = _limit("Generations in flight at once.")  # type: ignore[assignment]

    def limits(self) -> Limits:
        return Limits(**self.model_dump())


class TenantLimitsBody(KeyLimitsBody):
    """A tenant's limits, all replaced by a PUT: a field left out becomes unlimited (share_weight: 1)."""

    max_training_jobs: LimitValue = _limit(  # type: ignore[assignment]
        "Fine-tuning jobs running at once; the tenant's other jobs wait queued.")
    monthly_tokens: LimitValue = _limit(  # type: ignore[assignment]
        "Input plus output tokens per calendar month (UTC); past it requests get 429 insufficient_quota.")
    # Strict: pydantic would read `true` as 1.0, which the document's `number` does not allow.
    share_weight: StrictFloat = Field(
        default=1.0, gt=0, description="The tenant's weight in the engine's fair share: 2 gets twice the tokens "
                                       "of 1 while both wait.")


class KeyLimitsObject(KeyLimitsBody):
    object: Literal["api_key.limits"] = "api_key.limits"
    key_id: uuid.UUID

    @classmethod
    def of(cls, key_id: uuid.UUID, limits: Limits) -> KeyLimitsObject:
        return cls(key_id=key_id, requests_per_minute=limits.requests_per_minute,
                   tokens_per_minute=limits.tokens_per_minute, max_concurrent_requests=limits.max_concurrent_requests)


class TenantLimitsObject(TenantLimitsBody):
    object: Literal["tenant.limits"] = "tenant.limits"
    tenant: str

    @classmethod
    def of(cls, tenant: str, limits: Limits) -> TenantLimitsObject:
        return cls(tenant=tenant, requests_per_minute=limits.requests_per_minute,
                   tokens_per_minute=limits.tokens_per_minute, max_concurrent_requests=limits.max_concurrent_requests,
                   max_training_jobs=limits.max_training_jobs, monthly_tokens=limits.monthly_tokens,
                   share_weight=1.0 if limits.share_weight is None else limits.share_weight)


class LimitState(BaseModel):
    """One limit now: its setting, what is left of it, and seconds until it is whole again."""

    limit: int
    remaining: int
    reset_seconds: float


class LimitsLeft(BaseModel):
    """What is left now of each limit that is set (requests, tokens, concurrent_requests, monthly_tokens)."""

    tenant: dict[str, LimitState]
    key: dict[str, LimitState]


class CallerLimitsObject(BaseModel):
    tenant: TenantLimitsBody
    key: KeyLimitsBody
    remaining: LimitsLeft
