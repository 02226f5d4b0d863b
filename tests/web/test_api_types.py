"""The console's API types are the server's: web/src/api/openapi.json is the OpenAPI document the app
serves, and web/src/api/schema.d.ts is what openapi-typescript makes of it. Both are committed (the
console builds without a server); this fails while either differs from what `make web-types` writes now."""
from __future__ import annotations

import subprocess
from pathlib import Path

from loraloom.platform.api.app import api_app
from loraloom.platform.api.openapi import document_text

WEB = Path(__file__).resolve().parents[2] / "web"
DOCUMENT = WEB / "src" / "api" / "openapi.json"
TYPES = WEB / "src" / "api" / "schema.d.ts"
# The same generator and arguments as web/package.json's `generate-types`, writing elsewhere.
GENERATOR = WEB / "node_modules" / ".bin" / "openapi-typescript"
STALE = "is stale: the server's schemas changed since it was generated; run `make web-types` and commit the result"


def test_the_committed_openapi_document_is_the_one_the_app_serves():
    assert DOCUMENT.read_text(encoding="utf-8") == document_text(api_app().openapi()), f"{DOCUMENT} {STALE}"


def test_the_committed_types_are_generated_from_the_committed_document(tmp_path):
    assert GENERATOR.is_file(), "openapi-typescript is not installed: run `make setup` (npm ci in web/)"
    generated = tmp_path / "schema.d.ts"
    subprocess.run([str(GENERATOR), str(DOCUMENT), "-o", str(generated)], cwd=WEB, check=True, capture_output=True,
                   timeout=120)
    assert TYPES.read_text(encoding="utf-8") == generated.read_text(encoding="utf-8"), f"{TYPES} {STALE}"
