"""The security headers on the real app's responses: the console's strict policy (scripts from this
origin only, no framing) on the console, the API's JSON, its errors and its streams; the docs pages'
policy allowing exactly their own inline scripts by hash."""
from __future__ import annotations

import base64
import hashlib
import re

import httpx
from live_api import bearer

from loraloom.platform.api.security_headers import CONTENT_SECURITY_POLICY, docs_policy


def policy(response: httpx.Response) -> dict[str, str]:
    """The Content-Security-Policy as {directive: its sources}."""
    directives = (part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
    return {name: rest for name, rest in directives}


def assert_framing_and_sniffing_refused(response: httpx.Response) -> None:
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert policy(response)["frame-ancestors"] == "'none'"


def test_console_api_errors_and_streams_carry_the_strict_policy(access_server):
    key = bearer(access_server.keys["developer"])
    with httpx.Client(base_url=access_server.url, timeout=120) as http:
        responses = [
            http.get("/console/"), http.get("/console/adapters"), http.get("/health"),
            http.get("/v1/models", headers=key), http.get("/v1/models"),  # a 401
            http.get("/v1/tenants", headers=key),  # a 403
            http.post("/v1/completions", json={"model": "base", "prompt": "Hi", "max_tokens": 1, "stream": True},
                      headers=key),
        ]
    for response in responses:
        assert_framing_and_sniffing_refused(response)
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert policy(response)["script-src"] == "'self'", response.request.url
    assert [response.status_code for response in responses] == [200, 200, 200, 200, 401, 403, 200]


def test_the_built_console_has_no_inline_script(access_server):
    page = httpx.get(f"{access_server.url}/console/", timeout=60).text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.DOTALL)
    assert scripts, "the console page loads its script"
    assert all('src="' in attributes and not body.strip() for attributes, body in scripts)
    assert not re.search(r"\son[a-z]+=", page)  # no inline event handlers either


def test_the_docs_pages_allow_their_own_inline_scripts_only(access_server):
    inline_scripts = {}
    with httpx.Client(base_url=access_server.url, timeout=60) as http:
        for path in ("/docs", "/docs/oauth2-redirect", "/redoc"):
            response = http.get(path)
            assert response.status_code == 200, path
            assert_framing_and_sniffing_refused(response)
            inline = re.findall(r"<script>(.*?)</script>", response.text, re.DOTALL)
            hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
                      for script in inline}
            allowed = policy(response)["script-src"].split()
            assert set(allowed) == {"'self'", *hashes}, path
            assert "'unsafe-inline'" not in allowed
            inline_scripts[path] = len(inline)
    assert inline_scripts == {"/docs": 1, "/docs/oauth2-redirect": 1, "/redoc": 0}


def test_a_docs_policy_hashes_each_inline_script_and_not_external_ones():
    page = b"<script src='/a.js'></script><script>run()</script><script>go()</script>"
    sources = docs_policy(page).split(";")[0].split()
    expected = {"'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'" for body in (b"run()", b"go()")}
    assert set(sources) == {"script-src", "'self'", *expected}
