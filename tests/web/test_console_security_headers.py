"""The console's security headers in a real browser: the strict Content-Security-Policy reaches the
browser, the console renders every page under it (the operator's Server page with its uPlot chart
included) with no violation in the browser's console, and a page of another origin cannot frame it."""
from __future__ import annotations

import re

from playwright.sync_api import expect

CSP_VIOLATION = re.compile(r"Content Security Policy|Refused to (execute|load|apply|frame)", re.IGNORECASE)


def test_the_console_renders_under_its_policy_with_no_violation(console, console_page):
    page = console_page.page
    response = page.goto(console.url + "/console/")
    headers = response.all_headers()
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "'unsafe-inline'" not in headers["content-security-policy"].split("script-src", 1)[1].split(";")[0]
    assert (headers["x-frame-options"], headers["x-content-type-options"]) == ("DENY", "nosniff")
    assert headers["referrer-policy"] == "no-referrer"
    console_page.sign_in(console.keys["default-admin"])  # the operator: the Server page draws its chart
    for path, heading in (("/console/adapters", "Adapters"), ("/console/playground", "Playground"),
                          ("/console/server", "Server")):
        console_page.open(path)
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
    expect(page.get_by_role("img", name="Generated tokens per second")).to_be_visible()
    expect(page.locator(".chart canvas").first).to_be_attached()  # uPlot drew under the policy
    violations = [error for error in console_page.errors if CSP_VIOLATION.search(error)]
    assert violations == [] and console_page.unexpected_errors() == []


def test_another_origin_cannot_frame_the_console(console, console_page):
    page = console_page.page
    # about:blank is another origin; the browser reports the refusal on the framing page's console.
    with page.expect_console_message(lambda message: "frame-ancestors" in message.text, timeout=60_000):
        page.set_content(f'<iframe id="framed" src="{console.url}/console/"></iframe>')
    expect(page.frame_locator("#framed").get_by_label("API key")).to_have_count(0)  # nothing of it rendered
