"""Issue 13 item 7: /docs used to load Swagger UI from a CDN, so it was blank offline. In a real
browser the page must render the API's operations with every request staying on this server."""
from __future__ import annotations

from urllib.parse import urlsplit

from playwright.sync_api import expect


def test_the_docs_page_renders_with_no_request_leaving_the_server(console_page):
    page = console_page.page
    origins: set[str] = set()

    def note(request) -> None:
        url = urlsplit(request.url)
        if url.scheme in ("http", "https", "ws", "wss"):  # data: and blob: URLs never leave the page
            origins.add(f"{url.scheme}://{url.netloc}")

    page.on("request", note)
    console_page.open("/docs")
    # Rendered from the OpenAPI document: an operation of ours, not only the page's frame.
    expect(page.locator(".opblock-summary-path", has_text="/v1/chat/completions").first).to_be_visible()
    assert origins == {console_page.url.rstrip("/")}, f"requests left the server: {sorted(origins)}"
    assert console_page.unexpected_errors() == []
