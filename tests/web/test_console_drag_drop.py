"""Uploads by real drag and drop on the console's drop zone, in headless Chromium against a live
server: a PEFT directory's two files and a .tar.gz are registered (with the progress bar shown
while they go up) and listed; a malformed adapter shows the server's validation message next to
the file and nothing is registered."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest
from console_drops import drop_files, peft_files, tar_gz
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect
from safetensors.torch import load_file, save_file

KEY = "umbrella-developer"
# Set before the upload starts: records whether the progress bar was ever in the page, however
# briefly (a localhost upload of a small adapter can be over before an expectation polls).
WATCH_PROGRESS = """() => {
    window.progressShown = false;
    new MutationObserver(() => {
        if (document.querySelector('progress[aria-label="Upload progress"]')) window.progressShown = true;
    }).observe(document.body, { childList: true, subtree: true });
}"""


@pytest.fixture(scope="module")
def dropped(model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dropped")
    good = make_peft_adapter(model_dir, root / "dropped-dir", rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=5)
    archived = make_peft_adapter(model_dir, root / "Dropped Archive", rank=2, alpha=4, target_modules=["k_proj"], seed=6)
    broken = shutil.copytree(good, root / "dropped-broken")
    weights = load_file(broken / "adapter_model.safetensors")
    name = next(name for name in sorted(weights) if "v_proj.lora_B" in name)
    weights[name] = weights[name][:7].contiguous()  # v_proj's B with 7 output rows: fits no layer
    save_file(weights, str(broken / "adapter_model.safetensors"))
    return {"good": good, "archived": archived, "broken": broken}


def open_upload(console, console_page):
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    page.get_by_role("link", name="Upload", exact=True).click()
    expect(page.get_by_role("heading", name="Upload an adapter")).to_be_visible()
    return page


def upload_shows_progress_and_registers(page, reference: str) -> None:
    page.evaluate(WATCH_PROGRESS)
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text(f"Registered {reference}")
    assert page.evaluate("window.progressShown"), "no progress bar while the files went up"


def listed_row(page, name: str):
    page.get_by_role("link", name="Adapters", exact=True).click()
    return page.get_by_role("table", name="Adapters").get_by_role("row").filter(has_text=name)


def test_a_dropped_peft_directory_uploads_with_progress_and_is_listed(console, console_page, dropped):
    page = open_upload(console, console_page)
    # A PEFT directory as a drop delivers it, with a file the server does not need.
    drop_files(page, {**peft_files(dropped["good"]), "README.md": b"# notes\n"})
    files = page.get_by_role("list", name="Files to upload").get_by_role("listitem")
    expect(files).to_have_count(2)
    expect(files.nth(0)).to_contain_text("adapter_config.json")
    expect(files.nth(1)).to_contain_text("adapter_model.safetensors")
    page.get_by_label("Adapter name").fill("dropped-dir")
    upload_shows_progress_and_registers(page, "dropped-dir@1")
    row = listed_row(page, "dropped-dir")
    expect(row).to_contain_text("v1")
    expect(row).to_contain_text("q_proj, v_proj")
    assert not console_page.unexpected_errors()


def test_a_dropped_tar_gz_is_named_after_the_archive_and_registered(console, console_page, dropped):
    page = open_upload(console, console_page)
    drop_files(page, {"Dropped Archive.tar.gz": tar_gz(dropped["archived"])})
    expect(page.get_by_role("list", name="Files to upload")).to_contain_text("Dropped Archive.tar.gz")
    expect(page.get_by_label("Adapter name")).to_have_value("dropped-archive")
    upload_shows_progress_and_registers(page, "dropped-archive@1")
    expect(listed_row(page, "dropped-archive")).to_contain_text("k_proj")
    assert not console_page.unexpected_errors()


def test_a_dropped_malformed_adapter_shows_the_servers_message_and_registers_nothing(console, console_page, dropped):
    page = open_upload(console, console_page)
    drop_files(page, peft_files(dropped["broken"]))
    page.get_by_label("Adapter name").fill("dropped-broken")
    page.get_by_role("button", name="Upload", exact=True).click()
    refusal = page.get_by_role("list", name="Files to upload").get_by_role("alert")
    expect(refusal).to_contain_text("400")
    # The module the server names and the wrong shape it found (7 output rows of rank 4).
    expect(refusal).to_contain_text(re.compile(r"v_proj lora_B has shape \[7, 4\], expected \[\d+, 4\]"))
    expect(page.get_by_role("status")).to_have_count(0)
    response = httpx.get(f"{console.url}/v1/adapters/dropped-broken", headers=bearer(console.keys[KEY]))
    assert response.status_code == 404, response.text  # nothing registered
    assert not console_page.unexpected_errors("status of 400")
