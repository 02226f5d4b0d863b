"""The audit log: one audit_log row for every mutating API call, whatever its outcome.

One ASGI middleware (api/middleware.py: AuditMiddleware) covers every route, present and
future: a POST, PUT, PATCH or DELETE under /v1/ that matched a route is recorded with who
(the caller that `authenticate` put on the request state; none if authentication failed),
what (method and route template, the resource and its id), when, and the status code.
Rows go through a BatchWriter, so the call never waits for the audit insert.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Scope

from loraloom.platform.accounts.keys import Caller
from loraloom.platform.db.models import AuditLogEntry, utcnow

AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Inference changes nothing: it is metered per request in usage_records instead.
NOT_AUDITED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
API_PREFIX = "/v1/"
MAX_ERROR_CHARS = 500


def is_audited(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["method"] in AUDITED_METHODS
        and scope["path"].startswith(API_PREFIX)
        and scope["path"] not in NOT_AUDITED_PATHS
    )


def resource_type(route_path: str) -> str:
    """The first segment after /v1/ of the route template: "/v1/keys/{key_id}" -> "keys"."""
    return route_path.removeprefix(API_PREFIX).split("/", 1)[0][:32]


def audit_entry(scope: Scope, status_code: int, response_json: Any) -> dict[str, Any] | None:
    """The audit_log row for a finished call; None if no route matched (nothing could change)."""
    route = scope.get("route")
    if route is None:
        return None
    caller: Caller | None = scope.get("state", {}).get("caller")
    path_params: dict[str, Any] = {name: str(value) for name, value in scope.get("path_params", {}).items()}
    resource_id = None
    if isinstance(response_json, dict) and isinstance(response_json.get("id"), str):
        resource_id = response_json["id"]  # a created resource names itself in the response
    elif path_params:
        resource_id = "/".join(path_params.values())
    details: dict[str, Any] = {"path": scope["path"], "path_params": path_params}
    if isinstance(response_json, dict) and isinstance(response_json.get("error"), dict):
        details["error"] = str(response_json["error"].get("message", ""))[:MAX_ERROR_CHARS]
    request_id = scope["state"].get("request_id")  # api/request_log.py: the client's X-Request-ID, or one made
    client = scope.get("client")
    return {
        "tenant_id": None if caller is None else caller.tenant_id,
        "actor_key_id": None if caller is None else caller.api_key_id,
        "action": f"{scope['method']} {route.path}"[:64],
        "resource_type": resource_type(route.path),
        "resource_id": None if resource_id is None else resource_id[:64],
        "request_id": request_id,
        "status_code": status_code,
        "client_ip": None if client is None else client[0][:45],
        "details": details,
        "created_at": utcnow(),
    }


def write_audit_entries(session_factory: sessionmaker[Session], rows: Sequence[dict[str, Any]]) -> None:
    with session_factory.begin() as session:
        session.execute(insert(AuditLogEntry), list(rows))
