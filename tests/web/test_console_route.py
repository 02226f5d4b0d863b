"""The console's files as the API server serves them: / redirects, client routes get index.html,
assets are cached for good, nothing outside the build is reachable, and without a build the
server still answers with what to run."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from loraloom.platform.api.console import install_console


def client_for(dist) -> TestClient:
    app = FastAPI()
    install_console(app, dist)
    return TestClient(app, follow_redirects=False)


def test_built_console_is_served_with_client_routes_and_cached_assets(tmp_path):
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<html>console</html>")
    (dist / "assets" / "index-abc.js").write_text("js")
    (tmp_path / "secret.txt").write_text("outside")
    client = client_for(dist)
    assert client.get("/").headers["location"] == "/console/"
    for path in ("/console", "/console/", "/console/adapters/support-bot", "/console/%2e%2e/secret.txt"):
        response = client.get(path)
        assert response.status_code == 200 and response.text == "<html>console</html>", path
        assert response.headers["cache-control"] == "no-cache"
    asset = client.get("/console/assets/index-abc.js")
    assert asset.text == "js" and "immutable" in asset.headers["cache-control"]


def test_without_a_build_the_console_says_to_run_make_setup(tmp_path):
    response = client_for(tmp_path / "missing").get("/console/adapters")
    assert response.status_code == 503
    assert "make setup" in response.text
