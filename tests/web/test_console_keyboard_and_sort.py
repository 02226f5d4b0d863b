"""The console without a mouse, and the adapters list sorted by what the listing API now carries:
sign in with the keyboard alone, tab through the adapters list with the focus always visible, open
an adapter with Enter, and a confirm dialog that keeps the focus inside until Escape closes it;
clicking the Rank header orders the adapters by their latest version's rank."""
from __future__ import annotations

import httpx
import pytest
from console_drops import push_adapter
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect

KEY = "umbrella-developer"
RANKS = {"kb-rank-2": 2, "kb-rank-8": 8, "kb-rank-6": 6}  # pushed in this order: neither by name nor by rank
MAX_TABS = 80  # more than the adapters page has stops before the rows
# Whether the focused element shows it: :focus-visible matches (focus came from the keyboard) and
# the stylesheet draws an outline for it.
FOCUS_SHOWN = """() => {
    const element = document.activeElement;
    return element !== document.body && element.matches(':focus-visible')
        && getComputedStyle(element).outlineStyle !== 'none';
}"""
FOCUSED = """() => ({
    tag: document.activeElement.tagName,
    text: document.activeElement.textContent.trim(),
    in_table: document.activeElement.closest('table[aria-label="Adapters"]') !== null,
})"""


@pytest.fixture(scope="module")
def ranked(console, model_dir, tmp_path_factory) -> dict[str, int]:
    root = tmp_path_factory.mktemp("ranked")
    for seed, (name, rank) in enumerate(RANKS.items()):
        directory = make_peft_adapter(model_dir, root / name, rank=rank, alpha=2 * rank, target_modules=["q_proj"], seed=seed)
        push_adapter(console.url, console.keys[KEY], name, directory)
    return RANKS


def test_sign_in_and_the_adapters_list_work_from_the_keyboard(console, console_page, ranked):
    page = console_page.page
    console_page.open()
    expect(page.get_by_label("API key")).to_be_focused()  # the one field to fill has the focus at once
    page.keyboard.type(console.keys[KEY])
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Sign in")).to_be_focused()
    assert page.evaluate(FOCUS_SHOWN)
    page.keyboard.press("Enter")
    expect(page.get_by_role("table", name="Adapters")).to_contain_text("kb-rank-6")

    # Tab from the top of the page to the first adapter's link; every stop on the way shows its focus.
    stops = []
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        focused = page.evaluate(FOCUSED)
        stops.append(focused)
        assert page.evaluate(FOCUS_SHOWN), f"focus not visible on {focused}"
        if focused["tag"] == "A" and focused["in_table"]:
            break
    else:
        pytest.fail(f"no adapter link after {MAX_TABS} tabs: {stops}")
    assert stops[0]["text"] == "Skip to content"
    assert {"tag": "INPUT", "text": "", "in_table": False} in stops  # the search field is on the way
    name = stops[-1]["text"]
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=name, exact=True)).to_be_visible()
    assert not console_page.unexpected_errors()


def test_the_confirm_dialog_keeps_the_focus_and_escape_closes_it(console, console_page, ranked):
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    row = page.get_by_role("table", name="Adapters").get_by_role("row").filter(has_text="kb-rank-8")
    expect(row.get_by_role("button")).to_have_count(0)  # deleting is on the adapter's page, not its row
    row.get_by_role("link", name="kb-rank-8").click()
    delete = page.get_by_role("button", name="Delete adapter")
    delete.focus()
    page.keyboard.press("Enter")
    dialog = page.get_by_role("alertdialog", name="Delete kb-rank-8 and all its versions?")
    expect(dialog.get_by_role("button", name="Delete")).to_be_focused()
    for _ in range(3):  # around the dialog's two buttons and back, never out of it
        page.keyboard.press("Tab")
        assert dialog.evaluate("(box) => box.contains(document.activeElement)")
        assert page.evaluate(FOCUS_SHOWN)
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    expect(delete).to_be_focused()  # back where the user was
    response = httpx.get(f"{console.url}/v1/adapters/kb-rank-8", headers=bearer(console.keys[KEY]))
    assert response.status_code == 200, response.text  # Escape deleted nothing
    assert not console_page.unexpected_errors()


def test_the_adapters_list_sorts_by_rank(console, console_page, ranked):
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    table = page.get_by_role("table", name="Adapters")
    expect(table).to_contain_text("kb-rank-6")
    header = table.get_by_role("columnheader", name="Rank")
    ranks = table.locator("tbody tr td:nth-child(4)")
    header.get_by_role("button").click()
    expect(header).to_have_attribute("aria-sort", "descending")  # numbers: the largest first
    expect(table.locator("tbody tr").first).to_contain_text("kb-rank-8")
    listed = [int(text) for text in ranks.all_inner_texts()]
    assert listed == sorted(listed, reverse=True) and set(RANKS.values()) <= set(listed)
    header.get_by_role("button").click()
    expect(header).to_have_attribute("aria-sort", "ascending")
    expect(ranks.first).to_have_text("2")
    listed = [int(text) for text in ranks.all_inner_texts()]
    assert listed == sorted(listed)
    assert not console_page.unexpected_errors()
