"""The console in a real headless Chromium against a live `loraloom serve` on the bundled model:
sign-in, the adapter registry pages, promote and rollback, a refused upload, the playground.
Every assertion waits on what the page shows (Playwright's expectations), never on a sleep."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect
from safetensors.torch import load_file, save_file

ADAPTER = "support-bot"


@pytest.fixture(scope="module")
def adapter_dirs(model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    good = make_peft_adapter(model_dir, root / ADAPTER, rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=1)
    second = make_peft_adapter(model_dir, root / "second", rank=8, alpha=16, target_modules=["q_proj"], seed=2)
    # The same adapter with one module's A matrix of the wrong width: the server must refuse it, naming it.
    broken = root / "broken-bot"
    shutil.copytree(good, broken)
    weights = load_file(broken / "adapter_model.safetensors")
    name = next(name for name in sorted(weights) if "q_proj.lora_A" in name)
    weights[name] = weights[name][:, :100].contiguous()
    save_file(weights, str(broken / "adapter_model.safetensors"))
    return {"good": good, "second": second, "broken": broken}


def test_root_redirects_to_the_console_and_a_bad_key_shows_the_servers_message(console, console_page):
    console_page.open("/")
    assert console_page.page.url.endswith("/console/")
    console_page.page.get_by_label("API key").fill("ll-not-a-key")
    console_page.page.get_by_role("button", name="Sign in").click()
    expect(console_page.page.get_by_role("alert")).to_contain_text("401")
    assert not console_page.unexpected_errors("status of 401")


def test_sign_in_shows_tenant_and_role_and_sign_out_forgets_the_key(console, console_page):
    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    expect(page.get_by_test_id("who")).to_contain_text("acme")
    expect(page.get_by_test_id("who")).to_contain_text("developer")
    expect(page.get_by_role("link", name="Keys")).to_have_count(0)  # a developer key has no keys page
    page.reload()  # the key is kept in the tab's session
    expect(page.get_by_test_id("who")).to_contain_text("acme")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    assert not console_page.unexpected_errors()


def upload(page, directory: Path, name: str) -> None:
    page.get_by_role("link", name="Upload", exact=True).click()
    page.get_by_label("Choose a directory").set_input_files(str(directory))
    page.get_by_label("Adapter name").fill(name)
    page.get_by_role("button", name="Upload", exact=True).click()


def test_upload_list_open_promote_rollback_and_history(console, console_page, adapter_dirs):
    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    upload(page, adapter_dirs["good"], ADAPTER)
    expect(page.get_by_role("status")).to_contain_text(f"Registered {ADAPTER}@1")
    upload(page, adapter_dirs["second"], ADAPTER)
    expect(page.get_by_role("status")).to_contain_text(f"Registered {ADAPTER}@2")

    page.get_by_role("link", name="Adapters").click()
    table = page.get_by_role("table", name="Adapters")
    row = table.get_by_role("row").filter(has_text=ADAPTER)
    expect(row).to_contain_text("v2")
    expect(row).to_contain_text("q_proj")
    page.get_by_label("Search adapters").fill("no-such-adapter")
    expect(page.get_by_text("No rows match")).to_be_visible()
    page.get_by_label("Search adapters").fill("support")
    table.get_by_role("link", name=ADAPTER).click()

    expect(page.get_by_role("heading", name=ADAPTER)).to_be_visible()
    versions = page.get_by_role("table", name="Versions")
    expect(versions.get_by_role("row")).to_have_count(3)  # header + 2 versions
    expect(versions).to_contain_text("upload")
    # Promote v1 to prod, then v2, then roll back to v1.
    for version in ("1", "2"):
        page.get_by_label("Version to promote").select_option(version)
        page.get_by_role("button", name="Promote").click()
        page.get_by_role("button", name="Confirm").click()
        expect(page.locator("li[data-alias=prod] .alias-version")).to_have_text(f"v{version}")
    page.get_by_role("button", name="Roll back to v1").click()
    page.get_by_role("button", name="Confirm").click()
    expect(page.locator("li[data-alias=prod] .alias-version")).to_have_text("v1")
    prod = page.locator("li[data-alias=prod]")
    prod.get_by_text("History (3)").click()
    history = prod.get_by_role("list", name="prod history").get_by_role("listitem")
    expect(history).to_have_count(3)
    expect(history.nth(0)).to_contain_text(re.compile(r"created\s*→\s*v1"))
    expect(history.nth(1)).to_contain_text(re.compile(r"v1\s*→\s*v2"))
    expect(history.nth(2)).to_contain_text(re.compile(r"v2\s*→\s*v1"))
    assert not console_page.unexpected_errors()


def test_a_malformed_adapter_is_refused_with_the_servers_message_next_to_the_file(console, console_page, adapter_dirs):
    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    upload(page, adapter_dirs["broken"], "broken-bot")
    files = page.get_by_role("list", name="Files to upload")
    refusal = files.get_by_role("alert")
    expect(refusal).to_contain_text("400")
    expect(refusal).to_contain_text("q_proj")  # the module the server names
    expect(refusal).to_contain_text("100")  # and the wrong shape
    with httpx.Client(base_url=console.url, headers=bearer(console.keys["acme-developer"])) as http:
        assert http.get("/v1/adapters/broken-bot").status_code == 404  # nothing registered
    assert not console_page.unexpected_errors("status of 400")


def test_playground_streams_from_an_alias_and_side_by_side(console, console_page, adapter_dirs):
    key = console.keys["acme-developer"]
    with httpx.Client(base_url=console.url, headers=bearer(key), timeout=120) as http:
        if http.get(f"/v1/adapters/{ADAPTER}").status_code == 404:
            files = [("files", (p.name, p.read_bytes())) for p in sorted(adapter_dirs["good"].glob("adapter_*"))]
            assert http.post(f"/v1/adapters/{ADAPTER}/versions", files=files).status_code == 201
        assert http.put(f"/v1/adapters/{ADAPTER}/aliases/prod", json={"version": 1}).status_code == 200
    console_page.sign_in(key)
    page = console_page.page
    page.get_by_role("link", name="Playground").click()
    page.get_by_label("Model reference", exact=True).fill(f"{ADAPTER}:prod")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("12")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("answer-0")).not_to_be_empty()
    expect(page.get_by_test_id("answer-0")).to_have_attribute("aria-busy", "false")

    page.get_by_label("Side by side").check()
    page.get_by_label("Model reference", exact=True).fill("base")
    page.get_by_label("Second model reference").fill(f"{ADAPTER}:prod")
    page.get_by_label("Prompt").fill("Say hello in one sentence.")  # the box empties once a prompt is sent
    page.get_by_role("button", name="Send").click()
    for index in (0, 1):
        expect(page.get_by_test_id(f"answer-{index}")).not_to_be_empty()
        expect(page.get_by_test_id(f"answer-{index}")).to_have_attribute("aria-busy", "false")
    expect(page.get_by_role("article", name=f"Answer from {ADAPTER}:prod")).to_be_visible()
    assert not console_page.unexpected_errors()
