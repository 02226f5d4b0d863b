"""One structured log line per HTTP request, written when the response has ended, and the request id.

The request id is the client's `X-Request-ID` when it sends a usable one (so its own logs and
ours share an id), else a new one; either way the response carries it back in `X-Request-ID`,
the audit log records it, and the log line names it. The line (logger `loraloom.request`) holds:
request_id, method, path, route (its template), status, duration_ms, and once authenticated
tenant (its name, as the API and the metrics show it), tenant_id and api_key_id; for chat and text
completions also the adapter reference as the request wrote it (`adapter`: `support-bot:prod`) and
the adapter that served it (`adapter_resolved`: `support-bot@3`, a checkpoint id or a server-local
adapter's name; absent for the base model), completion_id, outcome (ok, error or aborted: how the
generation ended, which a stream's 200 does not say), prompt_tokens, completion_tokens and
time_to_first_token_ms. A streamed response is logged once, after its last event, so its duration
and token counts are the whole stream's.

Polling is logged at DEBUG, not INFO: POLLING_ROUTES, the GETs that scrapers, `loraloom jobs follow`
and the console's live pages repeat every few seconds (health, metrics, a job, its events and
checkpoints, the jobs list, the engine status). At INFO they made most of the lines.

Pure ASGI (api/asgi.py), like the other middlewares, so streaming is not buffered.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from loraloom.platform.accounts.keys import Caller
from loraloom.platform.api.asgi import HttpMiddleware
from loraloom.platform.api.response_metrics import route_template
from loraloom.platform.metering.usage import UsageMeter

logger = logging.getLogger("loraloom.request")

REQUEST_ID_HEADER = "x-request-id"
# An id we echo lands in logs, headers and a 64-character column (usage and audit rows): only
# short ids of safe characters are honoured; anything else is replaced, never trusted.
USABLE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,64}")
# Repeated every few seconds by scrapers, `jobs follow` and the console's refreshes: logged at DEBUG.
POLLING_ROUTES = frozenset({
    "/health", "/metrics", "/v1/engine/status", "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs/{job_id}",
    "/v1/fine_tuning/jobs/{job_id}/events", "/v1/fine_tuning/jobs/{job_id}/checkpoints",
})


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER.encode():
            text = value.decode("latin-1")
            return text if USABLE_REQUEST_ID.fullmatch(text) else None
    return None


class RequestLogMiddleware(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = _incoming_request_id(scope) or f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.monotonic()
        status = 500  # if the app fails before answering, the client gets a 500

        async def send_with_request_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_request_id)
        finally:
            fields = request_fields(scope, status, (time.monotonic() - started) * 1000)
            polling = scope["method"] in ("GET", "HEAD") and fields["route"] in POLLING_ROUTES
            level = logging.DEBUG if polling else logging.INFO
            logger.log(level, "%s %s %d", scope["method"], scope["path"], status, extra=fields)


def request_fields(scope: Scope, status: int, duration_ms: float) -> dict[str, Any]:
    state = scope["state"]
    caller: Caller | None = state.get("caller")  # put there by `authenticate`
    fields: dict[str, Any] = {
        "request_id": state["request_id"],
        "method": scope["method"],
        "path": scope["path"],
        "route": route_template(scope),
        "status": status,
        "duration_ms": round(duration_ms, 3),
        "tenant": None if caller is None else caller.tenant_name,
        "tenant_id": None if caller is None else str(caller.tenant_id),
        "api_key_id": None if caller is None else str(caller.api_key_id),
    }
    meter: UsageMeter | None = state.get("usage_meter")  # put there by the completions' meter dependency
    if meter is not None:
        fields.update(meter.log_fields())
    return fields
