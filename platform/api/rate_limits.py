"""Rate limits at the API: a generation is admitted (or refused with 429, or 503 on a full server)
before it reaches the engine, settled when it ends, and every response of a limited route says
what is left in OpenAI's headers:

    x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests
    x-ratelimit-limit-tokens,   x-ratelimit-remaining-tokens,   x-ratelimit-reset-tokens

(resets as durations: "1s", "6m0s", "250ms"), the tightest of the tenant's and the key's buckets;
none for a kind without a limit. A 429 carries Retry-After (seconds) and retry-after-ms, which the
openai SDK waits for before it retries; a refusal that no wait can lift (a request larger than a
bucket, the monthly quota) carries x-should-retry: false, which stops the SDK from retrying.
"""
from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Coroutine
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from loraloom.engine import EngineClient
from loraloom.platform.api.asgi import HttpMiddleware
from loraloom.platform.api.errors import APIError
from loraloom.platform.api.overload import OverloadGuard
from loraloom.platform.api.schemas.common import ErrorResponse
from loraloom.platform.db.models import utcnow
from loraloom.platform.limits.admission import (
    CONCURRENT,
    MONTHLY_TOKENS,
    REQUESTS,
    TOKENS,
    Gate,
    Headroom,
    Throttled,
    Ticket,
    Who,
)
from loraloom.platform.limits.limiter import LimiterUnavailableError
from loraloom.platform.limits.policy import UNLIMITED, CallerLimits
from loraloom.platform.metering.throttle_metrics import ThrottledRequests
from loraloom.platform.metering.usage import UsageMeter

def _header_doc(description: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": kind}}


# The OpenAPI entries of a rate-limited route: the headers of its answers, and its 429 and 503.
RATELIMIT_HEADERS_DOC = {
    f"x-ratelimit-{what}-{kind}": _header_doc(f"{description} ({kind}; only when a {kind} limit applies)")
    for kind in ("requests", "tokens")
    for what, description in (("limit", "The limit per minute"), ("remaining", "What is left of it now"),
                              ("reset", "When it is whole again, e.g. 1s, 6m0s"))
}
RETRY_HEADERS_DOC = {
    "Retry-After": _header_doc("Seconds until a retry can succeed", "integer"),
    "retry-after-ms": _header_doc("The same in milliseconds", "integer"),
}


def rate_limited_responses() -> dict[int | str, dict[str, Any]]:
    return {
        429: {"model": ErrorResponse, "headers": {**RETRY_HEADERS_DOC, **RATELIMIT_HEADERS_DOC},
              "description": "Over a rate limit (code rate_limit_exceeded; type requests, tokens or "
                             "concurrent_requests) or the monthly quota (insufficient_quota)"},
        503: {"model": ErrorResponse, "headers": RETRY_HEADERS_DOC,
              "description": "The server is full (server_overloaded) or its engine is unavailable"},
    }


logger = logging.getLogger(__name__)
HEADERS_STATE = "rate_limit_headers"  # request.state: the x-ratelimit-* headers of this response
LIMIT_NAMES = {
    REQUESTS: "requests per minute (RPM)",
    TOKENS: "tokens per minute (TPM)",
    CONCURRENT: "concurrent requests",
    MONTHLY_TOKENS: "tokens per month",
}


def duration_text(seconds: float) -> str:
    """OpenAI's reset format (Go's durations): "250ms" under a second, else "1s", "6m0s", "1h2m3s"."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(headroom: dict[str, Headroom]) -> dict[str, str]:
    headers = {}
    for kind in (REQUESTS, TOKENS):
        room = headroom.get(kind)
        if room is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(room.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(room.remaining)
            headers[f"x-ratelimit-reset-{kind}"] = duration_text(room.reset_s)
    return headers


def throttled_error(throttled: Throttled) -> APIError:
    refusal = throttled.refusal
    headers = ratelimit_headers(throttled.headroom)
    whose = "this API key" if refusal.scope == "key" else "this tenant"
    what = LIMIT_NAMES[refusal.limit]
    if refusal.retry_after_s is not None:
        retry_s = max(refusal.retry_after_s, 0.001)
        headers |= {"Retry-After": str(math.ceil(retry_s)), "retry-after-ms": str(math.ceil(retry_s * 1000))}
    if refusal.limit == MONTHLY_TOKENS:
        headers["x-should-retry"] = "false"
        return APIError(429, f"You exceeded your current quota: {whose} has used its {refusal.value} {what}; it "
                             f"renews at the start of the next month (UTC), or ask the operator to raise it",
                        code="insufficient_quota", error_type="insufficient_quota", headers=headers)
    if refusal.retry_after_s is None:
        headers["x-should-retry"] = "false"
        return APIError(429, f"Request too large: it needs {refusal.asked} tokens (prompt + max_tokens x n), more "
                             f"than the {refusal.value} {what} of {whose}; lower max_tokens or shorten the prompt",
                        code="rate_limit_exceeded", error_type=TOKENS, headers=headers)
    return APIError(429, f"Rate limit reached for {what} of {whose}: limit {refusal.value}. Please try again in "
                         f"{duration_text(refusal.retry_after_s)}",
                    code="rate_limit_exceeded", error_type=refusal.limit, headers=headers)


class RateLimits:
    """A gateway's limits (app.state.rate_limits): the gate over its limiter, the overload guard,
    the throttled-requests counter, and the settlements still running.

    A request settles when its usage meter finishes, which happens in code that cannot wait (a
    stream's cleanup): the settlement runs as a task, and the next admission in this gateway waits
    for those pending, so one client's sequential requests always see their earlier refunds."""

    def __init__(self, gate: Gate, overload: OverloadGuard, throttled: ThrottledRequests) -> None:
        self.gate = gate
        self.overload = overload
        self.throttled = throttled
        self._pending: set[asyncio.Task[None]] = set()

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._logged(work))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _logged(work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except LimiterUnavailableError as error:  # its counters heal as their buckets refill and leases end
            logger.warning("a request's rate-limit settlement was lost: %s", error)

    async def settled(self) -> None:
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def admit(self, request: Request, engine: EngineClient, meter: UsageMeter, *, tokens: int) -> Ticket:
        """Admit one generation costing `tokens` at most (or raise the 503 or 429); it is settled when
        `meter` finishes, or by `release` if it fails before its generation starts."""
        self.overload.check(await run_in_threadpool(engine.stats))
        await self.settled()
        caller = meter.caller
        limits: CallerLimits = getattr(request.state, "caller_limits", None) or CallerLimits(UNLIMITED, UNLIMITED)
        who = Who(tenant_id=caller.tenant_id, api_key_id=caller.api_key_id)
        try:
            ticket = await self.gate.admit(who, limits, tokens=tokens, holder=uuid.uuid4().hex, now=utcnow())
        except Throttled as throttled:
            self.throttled.count(tenant=caller.tenant_name, limit=throttled.refusal.limit)
            raise throttled_error(throttled) from None
        except LimiterUnavailableError as error:
            # Refusing every request while Redis is down would be an outage of its own: admit, unlimited.
            logger.warning("admitted without rate limits: %s", error, extra={"tenant": caller.tenant_name})
            return Ticket(token_charges=[], slots=[], charged_tokens=tokens, quota_key=None, settled=True)
        setattr(request.state, HEADERS_STATE, ratelimit_headers(ticket.headroom))
        meter.on_finish.append(lambda finished: self._on_finish(ticket, finished))
        return ticket

    def _on_finish(self, ticket: Ticket, meter: UsageMeter) -> None:
        self.overload.note_finished()
        counts = meter.token_counts()
        self._later(self.gate.settle(ticket, used_tokens=counts["prompt_tokens"] + counts["completion_tokens"]))

    def release(self, ticket: Ticket) -> None:
        """Settle a request that ended before its generation started: nothing was used."""
        self._later(self.gate.settle(ticket, used_tokens=0))


class RateLimitHeaders(HttpMiddleware):
    """Adds the x-ratelimit-* headers a route left in request.state to its response, a stream's included."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = scope.get("state", {}).get(HEADERS_STATE)
                if extra:
                    message["headers"] = [*message.get("headers", []),
                                          *((name.encode(), value.encode()) for name, value in extra.items())]
            await send(message)

        await self.app(scope, receive, send_with_headers)
