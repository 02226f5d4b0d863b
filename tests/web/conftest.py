"""Browser-test fixtures: one live server for the session, Debian's headless Chromium driven by
Playwright, a fresh page per test that records browser console errors, and a screenshot of the
page whenever a test fails (under .cache/console-screenshots/)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from console_live import Console, console_server

CHROMIUM = Path("/usr/bin/chromium")
# Expectations wait this long: a first token on two shared, busy cores can take seconds.
EXPECT_TIMEOUT_MS = 60_000
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".cache" / "console-screenshots"


@pytest.fixture(scope="session")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    built = Path(__file__).resolve().parents[2] / "web" / "dist" / "index.html"
    assert built.is_file(), "the console is not built: run `make setup`"
    directory = tmp_path_factory.mktemp("console")
    with console_server(directory / "data", directory / "serve.log") as live:
        yield live


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    assert CHROMIUM.is_file(), "Chromium is missing: `make setup` installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


@dataclass
class ConsolePage:
    """A page on the console, with the browser console's errors and the page's uncaught exceptions."""

    page: object
    url: str
    errors: list[str] = field(default_factory=list)

    def open(self, path: str = "/console/") -> None:
        self.page.goto(self.url + path)

    def sign_in(self, key: str) -> None:
        from playwright.sync_api import expect

        self.open()
        self.page.get_by_label("API key").fill(key)
        self.page.get_by_role("button", name="Sign in").click()
        expect(self.page.get_by_test_id("who")).to_be_visible()

    def unexpected_errors(self, *expected: str) -> list[str]:
        """Errors other than those matching `expected` patterns (e.g. a 400 the test asked for)."""
        return [error for error in self.errors if not any(re.search(pattern, error) for pattern in expected)]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def console_page(console: Console, browser, request) -> Iterator[ConsolePage]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    live = ConsolePage(page=page, url=console.url)
    page.on("console", lambda message: message.type == "error" and live.errors.append(message.text))
    page.on("pageerror", lambda error: live.errors.append(f"uncaught: {error}"))
    yield live
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{request.node.name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot of the failed test: {path}")
    context.close()
