"""The role matrix (platform/api/access.py, rendered in docs/ACCESS.md) against the real app: every
route and method the app serves, called with a key of every kind of caller, is refused with 403
exactly where the matrix says so. A route the matrix does not name fails the walk."""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
from fastapi.routing import iter_route_contexts
from live_api import bearer

from loraloom.platform.api.access import CALLERS, ROUTE_ACCESS, Access, access_table, answers

ACCESS_DOC = Path(__file__).resolve().parents[3] / "docs" / "ACCESS.md"
# The keys of the access_server fixture that play each caller of the matrix.
CALLER_KEYS = {"inference": "inference", "developer": "developer", "admin": "admin", "operator": "operator"}


def served_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, as declared; a mount (the offline docs' files) as GET."""
    routes = []
    for route in iter_route_contexts(app.routes):
        methods = getattr(route, "methods", None) or {"GET"}
        routes.extend((method, route.path) for method in sorted(methods))
    return routes


def concrete(path: str) -> str:
    """The path with every parameter filled in; a uuid passes every parameter's type (key ids are uuids)."""
    return re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)


def test_every_route_answers_every_caller_as_the_matrix_says(access_server):
    routes = served_routes(access_server.app)
    unlisted = sorted(set(routes) - ROUTE_ACCESS.keys())
    assert not unlisted, (
        f"routes without a line in the role matrix: {unlisted}; add them to ROUTE_ACCESS in "
        "platform/api/access.py and to docs/ACCESS.md"
    )
    gone = sorted(ROUTE_ACCESS.keys() - set(routes))
    assert not gone, f"the role matrix names routes the app does not serve: {gone}"
    wrong = []
    with httpx.Client(base_url=access_server.url, timeout=120) as http:
        for method, path in routes:
            access = ROUTE_ACCESS[(method, path)]
            for caller in CALLERS:
                # A minimal body: the role is checked before the body is, so `{}` is enough to see a refusal.
                body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
                response = http.request(method, concrete(path), headers=bearer(access_server.keys[CALLER_KEYS[caller]]),
                                        **body)
                refused = response.status_code == 403
                if refused != (not answers(access, caller)):
                    wrong.append(f"{method} {path} as {caller}: {response.status_code} {response.text[:120]}")
                elif refused:
                    error = response.json()["error"]
                    assert set(error) == {"message", "type", "param", "code"}, (method, path, caller)
                    assert error["code"] in ("insufficient_role", "operator_only"), (method, path, caller)
    assert not wrong, "answered against the role matrix:\n" + "\n".join(wrong)


def test_a_public_route_needs_no_key_and_the_rest_refuse_a_request_without_one(access_server):
    with httpx.Client(base_url=access_server.url, timeout=120) as http:
        for (method, path), access in ROUTE_ACCESS.items():
            status = http.request(method, concrete(path)).status_code
            assert (status == 401) == (access is not Access.public), (method, path, status)


def test_the_documented_matrix_is_the_one_enforced():
    assert access_table() in ACCESS_DOC.read_text(), (
        "docs/ACCESS.md's table differs from platform/api/access.py; paste this table there:\n" + access_table()
    )
