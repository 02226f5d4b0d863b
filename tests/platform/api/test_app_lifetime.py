"""An app that is done with is freed: nothing process-wide keeps it (and the engine in its state) alive.

FastAPI caches every route's callable process-wide, so a route function that closes over its app keeps
that app for good; a server process makes one app, but a test session makes one per module, and each
held on to its engine's gigabytes (offline_docs.py says more)."""
from __future__ import annotations

import gc
import weakref

from fastapi.testclient import TestClient

from loraloom.platform.api.app import api_app


def test_an_app_whose_every_page_was_served_is_freed_once_dropped():
    app = api_app()
    with TestClient(app) as client:
        for page in ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/console/"):
            assert client.get(page).status_code < 500, page
    dropped = weakref.ref(app)
    del app, client
    gc.collect()
    assert dropped() is None, [type(r).__name__ for r in gc.get_referrers(dropped())]
