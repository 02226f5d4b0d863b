"""A canary rollout from the adapter's page on a live server: an alias split between two versions in
the split editor (its shares as typed, a bad weight held back with the row named), the versions'
figures side by side from the usage the server metered through the alias, Promote (the split ends on
the canary) and Rollback (a later split ends on the version named before it), and the history of it all.

The figures come from usage rows written into the server's database as its meter writes them (the
version that served each request through `prod`), so the page's counts can be checked exactly."""
from __future__ import annotations

import re

import httpx
import pytest
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect
from sqlalchemy import select

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import Tenant, UsageStatus, utcnow
from loraloom.platform.metering.usage import write_usage_records

KEY = "initech-developer"
ADAPTER = "canary-bot"


@pytest.fixture(scope="module")
def two_versions(console, model_dir, tmp_path_factory) -> None:
    """canary-bot v1 and v2 in initech, prod pointing at v1."""
    root = tmp_path_factory.mktemp("canary")
    with httpx.Client(base_url=console.url, headers=bearer(console.keys[KEY]), timeout=120) as http:
        for number, seed in ((1, 21), (2, 22)):
            directory = make_peft_adapter(model_dir, root / f"v{number}", rank=4, alpha=8, target_modules=["q_proj"], seed=seed)
            files = [("files", (p.name, p.read_bytes())) for p in sorted(directory.glob("adapter_*"))]
            response = http.post(f"/v1/adapters/{ADAPTER}/versions", files=files)
            assert response.status_code == 201, response.text
        assert http.put(f"/v1/adapters/{ADAPTER}/aliases/prod", json={"version": 1}).status_code == 200


def meter(console, served: dict[int, tuple[int, int]]) -> None:
    """Usage rows of requests that named canary-bot:prod, as the meter writes them: version -> (ok, failed)."""
    engine = create_db_engine(console.database_url)
    try:
        factory = create_session_factory(engine)
        with factory() as session:
            tenant = session.execute(select(Tenant.id).where(Tenant.name == "initech")).scalar_one()
        rows = [
            {"tenant_id": tenant, "api_key_id": None, "adapter_version_id": None, "adapter_key": None,
             "adapter_name": ADAPTER, "adapter_version": version, "adapter_alias": "prod", "model": f"{ADAPTER}@{version}",
             "request_id": f"canary-{version}-{index}", "endpoint": "chat.completions",
             "status": UsageStatus.ok if index < ok else UsageStatus.error, "prompt_tokens": 10, "completion_tokens": 5,
             "cached_tokens": 0, "time_to_first_token_ms": 50.0, "duration_ms": 200.0, "created_at": utcnow()}
            for version, (ok, failed) in served.items() for index in range(ok + failed)
        ]
        write_usage_records(factory, rows)
    finally:
        engine.dispose()


def open_split_editor(prod):
    prod.locator("summary", has_text=re.compile("Split|Edit the split")).click()
    return prod.get_by_role("group", name="Split prod")


def test_split_compare_promote_split_again_and_roll_back(console, console_page, two_versions):
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    console_page.open(f"/console/adapters/{ADAPTER}")
    prod = page.locator("li[data-alias=prod]")
    expect(prod.locator(".alias-version")).to_have_text("v1")

    editor = open_split_editor(prod)
    # It starts from the alias's version at 90 and the newest other version at 10.
    expect(editor.get_by_label("Version of row 1")).to_have_value("1")
    expect(editor.get_by_label("Version of row 2")).to_have_value("2")
    editor.get_by_label("Weight of row 2").fill("30")
    expect(editor.get_by_test_id("share-1")).to_have_text("75%")
    expect(editor.get_by_test_id("share-2")).to_have_text("25%")
    editor.get_by_label("Weight of row 2").fill("0")
    expect(editor.get_by_role("note")).to_contain_text("Row 2")
    expect(editor.get_by_role("button", name="Save split")).to_be_disabled()
    editor.get_by_label("Weight of row 2").fill("10")
    editor.get_by_role("button", name="Save split").click()
    expect(prod.get_by_test_id("split-prod")).to_have_text("split v1 90% · v2 10%")
    with httpx.Client(base_url=console.url, headers=bearer(console.keys[KEY])) as http:
        assert http.get(f"/v1/adapters/{ADAPTER}/aliases/prod").json()["split"] == [
            {"version": 1, "weight": 90}, {"version": 2, "weight": 10}]

    # The versions side by side, from the requests through prod since the split began.
    meter(console, {1: (9, 0), 2: (1, 1)})
    figures = prod.get_by_role("table", name="prod versions side by side")
    expect(figures.get_by_role("columnheader")).to_have_text(["Figure", "v1", "v2"])
    row = lambda name: figures.get_by_role("row").filter(has=page.get_by_role("rowheader", name=name, exact=True))  # noqa: E731
    expect(row("Requests").get_by_role("cell")).to_have_text(["9", "2"], timeout=30_000)  # refreshed every 10 s
    expect(row("Errors").get_by_role("cell")).to_have_text(["0 (0%)", "1 (50%)"])
    expect(row("Share").get_by_role("cell")).to_have_text(["90%", "10%"])
    expect(row("Tokens").get_by_role("cell")).to_have_text(["135", "30"])

    prod.get_by_role("button", name="Promote v2", exact=True).click()
    page.get_by_role("button", name="Confirm").click()
    expect(prod.locator(".alias-version")).to_have_text("v2")
    expect(prod.get_by_test_id("split-prod")).to_have_count(0)
    expect(figures).to_have_count(0)

    editor = open_split_editor(prod)
    expect(editor.get_by_label("Version of row 1")).to_have_value("2")  # the promoted version at 90, v1 at 10
    editor.get_by_role("button", name="Save split").click()
    expect(prod.get_by_test_id("split-prod")).to_have_text("split v1 10% · v2 90%")
    prod.get_by_role("button", name="Roll back to v2", exact=True).click()
    page.get_by_role("button", name="Confirm").click()
    expect(prod.get_by_test_id("split-prod")).to_have_count(0)
    expect(prod.locator(".alias-version")).to_have_text("v2")

    prod.get_by_text(re.compile(r"^History \(")).click()
    history = prod.get_by_role("list", name="prod history").get_by_role("listitem")
    expect(history).to_have_count(5)
    expect(history.nth(0)).to_contain_text(re.compile(r"created\s*→\s*v1"))
    expect(history.nth(1)).to_contain_text("split v1 90% · v2 10%")
    expect(history.nth(2)).to_contain_text("v2 (promote)")
    expect(history.nth(3)).to_contain_text("split v1 10% · v2 90%")
    expect(history.nth(4)).to_contain_text("v2 (rollback)")
    assert not console_page.unexpected_errors()
