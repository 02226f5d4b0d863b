"""Every console page loads without browser console errors; an admin sees the keys page and a
key made there is shown once; a developer key has no keys page; tenant B's console never shows
tenant A's adapters, jobs or usage."""
from __future__ import annotations

import re

import httpx
import pytest
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect

PAGES = {  # path -> a heading each shows once loaded
    "/console/adapters": "Adapters",
    "/console/upload": "Upload an adapter",
    "/console/training": "Training",
    "/console/playground": "Playground",
    "/console/server": "Server",
    "/console/keys": "API keys of acme",
}
SECRET = "acme-secret-bot"


@pytest.fixture(scope="module")
def acme_adapter(console, model_dir, tmp_path_factory) -> str:
    """An adapter of tenant acme, used once (so it has usage and is resident)."""
    directory = make_peft_adapter(model_dir, tmp_path_factory.mktemp("secret") / SECRET, rank=4, alpha=8,
                                  target_modules=["q_proj"], seed=3)
    with httpx.Client(base_url=console.url, headers=bearer(console.keys["acme-admin"]), timeout=120) as http:
        files = [("files", (p.name, p.read_bytes())) for p in sorted(directory.glob("adapter_*"))]
        assert http.post(f"/v1/adapters/{SECRET}/versions", files=files).status_code == 201
        chat = {"model": SECRET, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
    return SECRET


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_loads_without_console_errors(console, console_page, acme_adapter, path):
    console_page.sign_in(console.keys["acme-admin"])
    console_page.open(path)
    expect(console_page.page.get_by_role("heading", name=PAGES[path], exact=True)).to_be_visible()
    expect(console_page.page.get_by_role("status")).to_have_count(0)  # nothing left loading
    assert not console_page.unexpected_errors()


def test_adapters_list_shows_usage_and_residency(console, console_page, acme_adapter):
    console_page.sign_in(console.keys["acme-admin"])
    row = console_page.page.get_by_role("table", name="Adapters").get_by_role("row").filter(has_text=SECRET)
    # Used, so resident; on this CPU server an adapter slot is a CPU slot, never called a GPU one.
    expect(row.get_by_role("cell").nth(10)).to_have_text(re.compile("CPU slot|host cache"))
    expect(row.get_by_role("button")).to_have_count(0)  # nothing destructive on a list row
    expect(row.get_by_role("cell").nth(8)).to_have_text("1")  # one request in the last 24 h


def test_admin_creates_a_key_shown_once_and_revokes_it(console, console_page):
    console_page.sign_in(console.keys["acme-admin"])
    page = console_page.page
    page.get_by_role("link", name="Keys").click()
    page.get_by_label("Key name").fill("ci-from-console")
    page.get_by_role("button", name="Create key").click()
    new_key = page.get_by_test_id("new-key").inner_text()
    assert new_key.startswith("ll-")
    assert httpx.get(f"{console.url}/v1/me", headers=bearer(new_key)).json()["key_name"] == "ci-from-console"
    row = page.get_by_role("table", name="Keys").get_by_role("row").filter(has_text="ci-from-console")
    expect(row.get_by_role("button")).to_have_count(0)  # revoking is on the key's own page
    row.get_by_role("link", name="ci-from-console").click()
    expect(page.get_by_role("heading", name="Key ci-from-console")).to_be_visible()
    page.get_by_role("button", name="Revoke").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Revoke").click()  # the confirmation
    expect(page.get_by_test_id("key-state")).to_contain_text("revoked")
    expect(page.get_by_role("button", name="Revoke")).to_have_count(0)
    assert httpx.get(f"{console.url}/v1/me", headers=bearer(new_key)).status_code == 401
    assert not console_page.unexpected_errors()


def test_operator_lists_and_creates_tenants(console, console_page):
    console_page.sign_in(console.keys["default-admin"])
    page = console_page.page
    page.get_by_role("link", name="Tenants").click()
    expect(page.get_by_role("table", name="Tenants")).to_contain_text("acme")
    page.get_by_label("Tenant name").fill("initech")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("table", name="Tenants")).to_contain_text("initech")
    page.get_by_label("Tenant name").fill("initech")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("alert")).to_contain_text("409")  # the server's refusal, shown
    assert not console_page.unexpected_errors("status of 409")


def test_a_developer_key_has_no_keys_page(console, console_page):
    console_page.sign_in(console.keys["acme-developer"])
    expect(console_page.page.get_by_role("link", name="Keys")).to_have_count(0)
    console_page.open("/console/keys")
    expect(console_page.page.get_by_role("alert")).to_contain_text("needs an admin key")


def test_tenant_b_never_sees_tenant_a(console, console_page, acme_adapter):
    console_page.sign_in(console.keys["globex-admin"])
    page = console_page.page
    expect(page.get_by_test_id("who")).to_contain_text("globex")
    expect(page.get_by_text("No adapters yet")).to_be_visible()
    page.get_by_role("link", name="Training").click()
    expect(page.get_by_text("No training jobs yet")).to_be_visible()
    page.get_by_role("link", name="Server").click()
    expect(page.get_by_text("None of your adapters is in a CPU slot")).to_be_visible()
    console_page.open(f"/console/adapters/{SECRET}")
    expect(page.get_by_role("alert")).to_contain_text("404")
    expect(page.get_by_text(SECRET, exact=True)).to_have_count(0)
    with httpx.Client(base_url=console.url, headers=bearer(console.keys["globex-admin"])) as http:
        series = http.get("/v1/usage/series", params={"granularity": "day", "start": "2000-01-01"})
        assert series.status_code == 400  # too wide a range, named
        series = http.get("/v1/usage/series").json()["data"]
        assert all(point["adapter"] != SECRET for point in series)
    assert not console_page.unexpected_errors("status of 404")


def test_operator_sets_a_tenants_limits(console, console_page):
    console_page.sign_in(console.keys["default-admin"])
    page = console_page.page
    page.get_by_role("link", name="Tenants").click()
    row = page.get_by_role("table", name="Tenants").get_by_role("row").filter(has_text="globex")
    row.get_by_role("link", name="Rate limits").click()
    expect(page.get_by_role("heading", name="Limits of globex")).to_be_visible()
    page.get_by_label("Requests per minute").fill("-1")
    page.get_by_role("button", name="Save limits").click()
    expect(page.get_by_role("alert")).to_contain_text("requests_per_minute")  # the server's 400, shown
    # Limits that leave globex's other tests alone: training jobs and its share of the engine.
    page.get_by_label("Requests per minute").fill("")
    page.get_by_label("Concurrent training jobs").fill("3")
    page.get_by_label("Fair-share weight").fill("2")
    page.get_by_role("button", name="Save limits").click()
    expect(page.get_by_role("status").filter(has_text="Saved")).to_be_visible()
    limits = httpx.get(f"{console.url}/v1/me", headers=bearer(console.keys["globex-admin"])).json()["limits"]
    assert limits["tenant"]["max_training_jobs"] == 3 and limits["tenant"]["share_weight"] == 2.0
    assert limits["tenant"]["requests_per_minute"] is None
    assert not console_page.unexpected_errors("status of 400")
