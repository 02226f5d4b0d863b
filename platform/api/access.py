"""The role matrix: which kind of caller may reach each route of the app, for every method.

Roles rank admin > developer > inference (db/models.py ApiKeyRole); the operator is an admin key
of tenant `default` and outranks a tenant's admin. An `inference` key is what an application
server holds: it reaches inference and what inference needs (the model list, who it is, its own
tenant's view of the engine), never training data, jobs, usage, adapter weights or keys.

This table is the documented policy (docs/ACCESS.md is rendered from it) and the oracle of
tests/platform/auth/test_role_matrix.py, which sends a request of every role to every route and
method of the real app and fails on a route missing here. The routes enforce it themselves, by
their dependencies (api/deps.py: CallerDep, DeveloperDep, AdminDep, OperatorDep); a route that
does not match its line here fails that test.
"""
from __future__ import annotations

import enum


class Access(str, enum.Enum):
    """The least caller a route answers; every caller ranked above it is answered too."""

    public = "public"  # no key at all
    inference = "inference"  # any valid key
    developer = "developer"  # a developer or admin key
    admin = "admin"  # an admin key: of its own tenant, or the operator's
    operator = "operator"  # the operator's admin key only


# The callers the matrix distinguishes, lowest first; a tenant's admin key is "admin".
CALLERS = ("inference", "developer", "admin", "operator")
_RANK = {"public": 0, "inference": 1, "developer": 2, "admin": 3, "operator": 4}

P, I, D, A, O = Access.public, Access.inference, Access.developer, Access.admin, Access.operator

# (method, path as the app declares it) -> the least caller answered.
ROUTE_ACCESS: dict[tuple[str, str], Access] = {
    # Inference and what a client needs around it.
    ("POST", "/v1/chat/completions"): I,
    ("POST", "/v1/completions"): I,
    ("GET", "/v1/models"): I,
    ("GET", "/v1/models/{model_id:path}"): I,
    ("GET", "/v1/me"): I,
    # The tenant's own running/waiting requests and resident adapters; nothing of other tenants.
    ("GET", "/v1/engine/status"): I,
    # The adapter registry: names, versions, aliases, history, and the weights themselves.
    ("GET", "/v1/adapters"): D,
    ("GET", "/v1/adapters/{name}"): D,
    ("DELETE", "/v1/adapters/{name}"): D,
    ("POST", "/v1/adapters/{name}/versions"): D,
    ("GET", "/v1/adapters/{name}/versions"): D,
    ("GET", "/v1/adapters/{name}/versions/{number}"): D,
    ("DELETE", "/v1/adapters/{name}/versions/{number}"): D,
    ("POST", "/v1/adapters/{name}/uploads"): D,
    ("POST", "/v1/adapters/{name}/uploads/complete"): D,
    ("GET", "/v1/adapters/{name}/aliases/{alias}"): D,
    ("PUT", "/v1/adapters/{name}/aliases/{alias}"): D,
    ("DELETE", "/v1/adapters/{name}/aliases/{alias}"): D,
    ("GET", "/v1/adapters/{name}/aliases/{alias}/history"): D,
    ("POST", "/v1/adapters/{name}/aliases/{alias}/promote"): D,
    ("POST", "/v1/adapters/{name}/aliases/{alias}/rollback"): D,
    ("GET", "/v1/adapters/{name}/versions/{number}/content"): D,
    ("GET", "/v1/adapters/{name}/versions/{number}/files/{filename}"): D,
    ("GET", "/v1/adapters/{name}/versions/{number}/download"): D,
    # Training data and jobs.
    ("POST", "/v1/files"): D,
    ("GET", "/v1/files"): D,
    ("GET", "/v1/files/{file_id}"): D,
    ("DELETE", "/v1/files/{file_id}"): D,
    ("GET", "/v1/files/{file_id}/content"): D,
    ("POST", "/v1/fine_tuning/jobs"): D,
    ("GET", "/v1/fine_tuning/jobs"): D,
    ("GET", "/v1/fine_tuning/jobs/{job_id}"): D,
    ("POST", "/v1/fine_tuning/jobs/{job_id}/cancel"): D,
    ("POST", "/v1/fine_tuning/jobs/{job_id}/pause"): D,
    ("POST", "/v1/fine_tuning/jobs/{job_id}/resume"): D,
    ("POST", "/v1/fine_tuning/estimate"): D,
    ("GET", "/v1/fine_tuning/jobs/{job_id}/events"): D,
    ("GET", "/v1/fine_tuning/jobs/{job_id}/checkpoints"): D,
    # Usage, and the tenant's keys (listed without secrets).
    ("GET", "/v1/usage"): D,
    ("GET", "/v1/usage/series"): D,
    ("GET", "/v1/usage/latency"): D,
    # A tenant's own top list; all_tenants=true is the operator's only (403 for others, like ?tenant=).
    ("GET", "/v1/usage/top_adapters"): D,
    ("GET", "/v1/keys"): D,
    # Keys: a tenant's admin in its tenant, the operator in any.
    ("POST", "/v1/keys"): A,
    ("DELETE", "/v1/keys/{key_id}"): A,
    # Tenants and server-wide telemetry: the operator's.
    ("POST", "/v1/tenants"): O,
    ("GET", "/v1/tenants"): O,
    # Suspension: every key of the tenant refused (403) and its streams ended, until resumed.
    ("POST", "/v1/tenants/{tenant}/suspend"): O,
    ("POST", "/v1/tenants/{tenant}/resume"): O,
    # Rate limits, quotas and fair-share weights (platform/limits): set by the operator only.
    ("GET", "/v1/tenants/{tenant}/limits"): O,
    ("PUT", "/v1/tenants/{tenant}/limits"): O,
    ("GET", "/v1/keys/{key_id}/limits"): O,
    ("PUT", "/v1/keys/{key_id}/limits"): O,
    ("GET", "/metrics"): O,
    # Served without a key: liveness, the API's description, and the console's files (which hold no data).
    ("GET", "/health"): P,
    ("GET", "/openapi.json"): P,
    ("HEAD", "/openapi.json"): P,
    ("GET", "/docs"): P,
    ("GET", "/docs/oauth2-redirect"): P,
    ("GET", "/redoc"): P,
    ("GET", "/static-offline-docs"): P,  # a mount: the /docs and /redoc scripts and styles
    ("GET", "/"): P,
    ("GET", "/console"): P,
    ("GET", "/console/{path:path}"): P,
}


def answers(access: Access, caller: str) -> bool:
    """Whether a route of `access` answers `caller` (one of CALLERS) rather than refusing it with 403."""
    return _RANK[caller] >= _RANK[access.value]


def access_table() -> str:
    """The matrix as the Markdown table of docs/ACCESS.md: one row per route and method."""
    header = "| method | path | " + " | ".join(CALLERS) + " |"
    lines = [header, "|" + " --- |" * (2 + len(CALLERS))]
    for (method, path), access in sorted(ROUTE_ACCESS.items(), key=lambda item: (item[0][1], item[0][0])):
        if access is Access.public:
            cells = ["no key"] * len(CALLERS)
        else:
            cells = ["yes" if answers(access, caller) else "403" for caller in CALLERS]
        lines.append(f"| {method} | `{path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
