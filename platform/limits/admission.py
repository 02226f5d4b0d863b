"""Admitting one generation request against its limits, and settling it when it ends.

At admission a request costs 1 request and (prompt tokens + max_tokens x n) tokens from each
bucket its tenant and key have, and one concurrency slot of each; its tenant's monthly quota must
not be used up. When it ends, `settle` trues the token charge up to what it used (prompt + output
tokens: the unused part goes back), frees its slots and adds its tokens to the quota counter.
Nothing here knows HTTP: api/rate_limits.py turns a Throttled into a 429.
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from loraloom.platform.limits.limiter import Acquired, BucketLevel, Charge, Limiter, Slot
from loraloom.platform.limits.policy import CallerLimits, Limits
from loraloom.platform.limits.quota import counter_ttl_s, next_month_start, quota_counter_key

REQUESTS = "requests"
TOKENS = "tokens"
CONCURRENT = "concurrent_requests"
MONTHLY_TOKENS = "monthly_tokens"


@dataclass(frozen=True)
class Who:
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None


@dataclass(frozen=True)
class Refusal:
    """The limit a request went over: `limit` is one of REQUESTS, TOKENS, CONCURRENT, MONTHLY_TOKENS."""

    limit: str
    scope: str  # "tenant" | "key"
    value: int  # the limit's setting
    retry_after_s: float | None  # None: waiting never helps (the request is larger than the limit)
    asked: int = 0  # what the request needed of it (tokens)


@dataclass(frozen=True)
class Headroom:
    """The tightest bucket of one kind (requests or tokens): what the x-ratelimit-* headers report."""

    limit: int
    remaining: int
    reset_s: float


class Throttled(Exception):
    def __init__(self, refusal: Refusal, headroom: dict[str, Headroom]) -> None:
        super().__init__(f"{refusal.scope} {refusal.limit} limit {refusal.value} reached")
        self.refusal = refusal
        self.headroom = headroom


@dataclass(frozen=True)
class _Counted:
    """A charge or slot, and the limit it stands for."""

    kind: str
    scope: str
    value: int


def _scopes(who: Who, limits: CallerLimits) -> list[tuple[str, str, Limits]]:
    scopes = [("tenant", f"tenant:{who.tenant_id}", limits.tenant)]
    if who.api_key_id is not None:
        scopes.append(("key", f"key:{who.api_key_id}", limits.key))
    return scopes


def _charges(who: Who, limits: CallerLimits, tokens: int) -> tuple[list[Charge], list[_Counted]]:
    charges, counted = [], []
    for scope, name, scope_limits in _scopes(who, limits):
        for kind, value, amount in ((REQUESTS, scope_limits.requests_per_minute, 1),
                                    (TOKENS, scope_limits.tokens_per_minute, tokens)):
            if value is not None:
                charges.append(Charge(key=f"{kind}:{name}", capacity=value, amount=amount))
                counted.append(_Counted(kind, scope, value))
    return charges, counted


def _slots(who: Who, limits: CallerLimits, holder: str) -> tuple[list[Slot], list[_Counted]]:
    slots, counted = [], []
    for scope, name, scope_limits in _scopes(who, limits):
        if scope_limits.max_concurrent_requests is not None:
            slots.append(Slot(key=f"{CONCURRENT}:{name}", limit=scope_limits.max_concurrent_requests, holder=holder))
            counted.append(_Counted(CONCURRENT, scope, scope_limits.max_concurrent_requests))
    return slots, counted


def headroom(levels: list[BucketLevel], counted: list[_Counted]) -> dict[str, Headroom]:
    """Per kind, the bucket with the least left (the one that refuses first)."""
    tightest: dict[str, Headroom] = {}
    for level, what in zip(levels, counted):
        room = Headroom(limit=what.value, remaining=max(0, int(level.remaining)), reset_s=max(0.0, level.reset_s))
        if what.kind not in tightest or room.remaining < tightest[what.kind].remaining:
            tightest[what.kind] = room
    return tightest


@dataclass
class Ticket:
    """An admitted request: what to true up and free when it ends. `settle` runs once."""

    token_charges: list[Charge]
    slots: list[Slot]
    charged_tokens: int
    quota_key: str | None
    headroom: dict[str, Headroom] = field(default_factory=dict)
    settled: bool = False


class Gate:
    """The limits of every request of one gateway, over one Limiter. `month_usage(tenant_id, now)`
    reads a tenant's metered tokens this month (a database query, run only to seed a counter)."""

    def __init__(self, limiter: Limiter, month_usage: Callable[[uuid.UUID, datetime], Awaitable[int]]) -> None:
        self.limiter = limiter
        self.month_usage = month_usage

    async def admit(self, who: Who, limits: CallerLimits, *, tokens: int, holder: str, now: datetime) -> Ticket:
        """Charge the request or raise Throttled naming the limit it went over."""
        quota_key = await self._check_quota(who, limits.tenant, now)
        charges, charged = _charges(who, limits, tokens)
        slots, slotted = _slots(who, limits, holder)
        acquired: Acquired = await self.limiter.acquire(charges, slots)
        room = headroom(acquired.levels, charged)
        if not acquired.ok:
            what = (charged + slotted)[acquired.refused]
            asked = tokens if what.kind == TOKENS else 1
            raise Throttled(Refusal(limit=what.kind, scope=what.scope, value=what.value,
                                    retry_after_s=acquired.retry_after_s, asked=asked), room)
        token_charges = [charge for charge, what in zip(charges, charged) if what.kind == TOKENS]
        return Ticket(token_charges=token_charges, slots=slots, charged_tokens=tokens, quota_key=quota_key,
                      headroom=room)

    async def _check_quota(self, who: Who, tenant: Limits, now: datetime) -> str | None:
        if tenant.monthly_tokens is None:
            return None
        key = quota_counter_key(who.tenant_id, now)
        used = await self.limiter.counter(key)
        if used is None:
            await self.limiter.seed_counter(key, await self.month_usage(who.tenant_id, now), counter_ttl_s(now))
            used = await self.limiter.counter(key) or 0
        if used >= tenant.monthly_tokens:
            raise Throttled(Refusal(limit=MONTHLY_TOKENS, scope="tenant", value=tenant.monthly_tokens,
                                    retry_after_s=(next_month_start(now) - now).total_seconds()), {})
        return key

    async def settle(self, ticket: Ticket, *, used_tokens: int) -> None:
        """True the token charge up to `used_tokens`, free the slots, count the quota. Once per ticket."""
        if ticket.settled:
            return
        ticket.settled = True
        unused = ticket.charged_tokens - used_tokens
        for charge in ticket.token_charges:
            if unused:
                await self.limiter.refund(Charge(key=charge.key, capacity=charge.capacity, amount=unused))
        if ticket.slots:
            await self.limiter.release(ticket.slots)
        if ticket.quota_key is not None and used_tokens:
            await self.limiter.add_to_counter(ticket.quota_key, used_tokens)

    async def remaining(self, who: Who, limits: CallerLimits, now: datetime) -> dict[str, dict[str, object]]:
        """For GET /v1/me: per scope, each limit's setting and what is left of it now."""
        charges, charged = _charges(who, limits, 0)
        levels = await self.limiter.peek(charges)
        report: dict[str, dict[str, object]] = {scope: {} for scope, _, _ in _scopes(who, limits)}
        for level, what in zip(levels, charged):
            report[what.scope][what.kind] = Headroom(limit=what.value, remaining=max(0, int(level.remaining)),
                                                     reset_s=max(0.0, level.reset_s))
        slots, slotted = _slots(who, limits, holder="")
        for slot, what in zip(slots, slotted):
            held = await self.limiter.holders(slot)
            report[what.scope][CONCURRENT] = Headroom(limit=what.value, remaining=max(0, what.value - held), reset_s=0)
        if limits.tenant.monthly_tokens is not None:
            used = await self.limiter.counter(quota_counter_key(who.tenant_id, now))
            if used is None:
                used = await self.month_usage(who.tenant_id, now)
            report["tenant"][MONTHLY_TOKENS] = Headroom(
                limit=limits.tenant.monthly_tokens, remaining=max(0, limits.tenant.monthly_tokens - used),
                reset_s=(next_month_start(now) - now).total_seconds())
        return report
