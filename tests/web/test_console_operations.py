"""The console's operator views on a live server: an adapter's latency percentiles, errors and tokens;
the top adapters by latency and errors (a tenant's own, every tenant's for the operator); CPU wording
and shared slots on the server page; deleting from the adapter's page; the operator's tenant page
(keys, usage, suspend and resume); and the multi-turn playground with its readout and its code, which
is run as copied.

Latency figures come from usage rows written into the server's database as its meter writes them, with
durations chosen here, so the page's percentiles can be checked exactly."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest
from live_api import bearer
from lora_factory import make_peft_adapter
from playwright.sync_api import expect
from sqlalchemy import select

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import Tenant, UsageStatus, utcnow
from loraloom.platform.metering.usage import write_usage_records

TIMED = "lat-bot"  # acme's adapter with known latencies
GLOBEX_SLOW = "slow-glob"  # globex's, far slower than anything of acme's
REQUESTS = 20
FAILED = 2  # the first two of acme's: no first token
CODE_TIMEOUT_S = 300  # a generation on two shared, busy cores


def usage_row(tenant_id, adapter: str, index: int, duration_ms: float, ttft_ms: float | None, status: UsageStatus) -> dict:
    return {
        "tenant_id": tenant_id, "api_key_id": None, "adapter_version_id": None, "adapter_key": None,
        "adapter_name": adapter, "adapter_version": 1, "adapter_alias": "latest", "model": adapter,
        "request_id": f"timed-{adapter}-{index}", "endpoint": "chat.completions", "status": status,
        "prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 0,
        "time_to_first_token_ms": ttft_ms, "duration_ms": duration_ms, "created_at": utcnow(),
    }


def upload(console, key: str, name: str, directory) -> None:
    with httpx.Client(base_url=console.url, headers=bearer(key), timeout=120) as http:
        files = [("files", (p.name, p.read_bytes())) for p in sorted(directory.glob("adapter_*"))]
        response = http.post(f"/v1/adapters/{name}/versions", files=files)
        assert response.status_code == 201, response.text


@pytest.fixture(scope="module")
def peft_dir(model_dir, tmp_path_factory):
    return make_peft_adapter(model_dir, tmp_path_factory.mktemp("ops") / "adapter", rank=4, alpha=8,
                             target_modules=["q_proj"], seed=11)


@pytest.fixture(scope="module")
def timed_usage(console, peft_dir) -> None:
    """acme's lat-bot: durations 1..20 s, first tokens 0.1..2 s, the first two failed without a token.
    globex's slow-glob: 15 minutes each. umbrella's own lat-bot: 10x slower, which acme must never see."""
    upload(console, console.keys["acme-admin"], TIMED, peft_dir)
    engine = create_db_engine(console.database_url)
    try:
        factory = create_session_factory(engine)
        with factory() as session:
            ids = dict(session.execute(select(Tenant.name, Tenant.id)).all())
        rows = []
        for k in range(1, REQUESTS + 1):
            failed = k <= FAILED
            rows.append(usage_row(ids["acme"], TIMED, k, 1000.0 * k, None if failed else 100.0 * k,
                                  UsageStatus.error if failed else UsageStatus.ok))
            rows.append(usage_row(ids["umbrella"], TIMED, k, 10_000.0 * k, 1000.0 * k, UsageStatus.ok))
        rows += [usage_row(ids["globex"], GLOBEX_SLOW, k, 900_000.0, 5000.0, UsageStatus.ok) for k in range(3)]
        write_usage_records(factory, rows)
    finally:
        engine.dispose()


def test_the_adapter_page_shows_latency_percentiles_errors_and_tokens(console, console_page, timed_usage):
    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    console_page.open(f"/console/adapters/{TIMED}")
    table = page.get_by_role("table", name="Latency per period")
    expect(table.get_by_role("row")).to_have_count(2)  # header + this hour
    cells = table.get_by_role("row").nth(1).get_by_role("cell")
    # Nearest rank over acme's rows only: TTFT among the 18 with a first token (0.3..2 s).
    expected = [str(REQUESTS), f"{FAILED} (10%)", "1.10 s", "2.00 s", "10.00 s", "19.00 s", str(REQUESTS * 15)]
    for index, text in enumerate(expected, start=1):
        expect(cells.nth(index)).to_have_text(text)
    expect(page.get_by_role("img", name="Latency percentiles")).to_have_attribute("data-points", "1")
    expect(page.get_by_role("img", name="Error rate")).to_be_visible()
    assert not console_page.unexpected_errors()


def test_the_server_page_ranks_a_tenant_s_own_adapters_and_the_operator_sees_all(console, console_page, timed_usage):
    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    page.get_by_role("link", name="Server").click()
    slowest = page.get_by_role("table", name="Slowest adapters")
    expect(slowest).to_contain_text(TIMED)
    expect(slowest).not_to_contain_text(GLOBEX_SLOW)
    expect(slowest.get_by_role("columnheader", name="Tenant")).to_have_count(0)
    failing = page.get_by_role("table", name="Adapters with most errors")
    expect(failing.get_by_role("row").filter(has_text=TIMED)).to_contain_text(f"{FAILED} (10%)")
    # A CPU server says so, and explains what a slot holds.
    expect(page.get_by_test_id("engine-device")).to_contain_text("on CPU")
    expect(page.get_by_test_id("slots-explained")).to_contain_text("byte-identical")
    expect(page.get_by_text("GPU slot")).to_have_count(0)

    page.get_by_role("button", name="Sign out").click()
    console_page.sign_in(console.keys["default-admin"])
    page.get_by_role("link", name="Server").click()
    first = page.get_by_role("table", name="Slowest adapters").get_by_role("row").nth(1)
    expect(first).to_contain_text("globex")
    expect(first).to_contain_text(GLOBEX_SLOW)
    expect(first).to_contain_text("15 min 0 s")
    assert not console_page.unexpected_errors()


def test_adapters_with_identical_weights_are_shown_sharing_one_slot(console, console_page, model_dir, tmp_path):
    key = console.keys["acme-admin"]
    twin = make_peft_adapter(model_dir, tmp_path / "twin", rank=4, alpha=8, target_modules=["v_proj"], seed=12)
    for name in ("twin-a", "twin-b"):
        upload(console, key, name, twin)
    console_page.sign_in(key)
    page = console_page.page
    with httpx.Client(base_url=console.url, headers=bearer(key), timeout=CODE_TIMEOUT_S) as http:
        for name in ("twin-a", "twin-b"):
            chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            assert http.post("/v1/chat/completions", json=chat).status_code == 200
    page.get_by_role("link", name="Server").click()
    resident = page.get_by_role("table", name="Resident adapters")
    for name, other in (("twin-a@1", "twin-b@1"), ("twin-b@1", "twin-a@1")):
        row = resident.get_by_role("row").filter(has=page.get_by_role("link", name=name, exact=True))
        expect(row).to_contain_text(f"shared with {other}: identical weights")
    assert not console_page.unexpected_errors()


def test_an_adapter_is_deleted_from_its_own_page_after_confirming(console, console_page, peft_dir):
    key = console.keys["acme-admin"]
    upload(console, key, "doomed-bot", peft_dir)
    console_page.sign_in(key)
    page = console_page.page
    row = page.get_by_role("table", name="Adapters").get_by_role("row").filter(has_text="doomed-bot")
    row.get_by_role("link", name="doomed-bot").click()
    page.get_by_role("button", name="Delete adapter").click()
    page.get_by_role("alertdialog", name="Delete doomed-bot and all its versions?").get_by_role("button", name="Delete").click()
    expect(page.get_by_role("heading", name="Adapters", exact=True)).to_be_visible()
    expect(page.get_by_role("table", name="Adapters")).not_to_contain_text("doomed-bot")
    assert httpx.get(f"{console.url}/v1/adapters/doomed-bot", headers=bearer(key)).status_code == 404
    assert not console_page.unexpected_errors()


def test_the_operator_manages_a_tenant_s_keys_sees_its_usage_and_suspends_it(console, console_page):
    operator = console.keys["default-admin"]
    created = httpx.post(f"{console.url}/v1/tenants", json={"name": "soylent"}, headers=bearer(operator))
    assert created.status_code == 201, created.text
    console_page.sign_in(operator)
    page = console_page.page
    page.get_by_role("link", name="Tenants").click()
    row = page.get_by_role("table", name="Tenants").get_by_role("row").filter(has_text="soylent")
    expect(row).to_contain_text("active")
    row.get_by_role("link", name="soylent").click()
    expect(page.get_by_role("heading", name="Tenant soylent")).to_be_visible()
    expect(page.get_by_text("No requests in the last 30 days.")).to_be_visible()

    page.get_by_label("Key name").fill("soylent-app")
    page.get_by_role("button", name="Create key").click()
    key = page.get_by_test_id("new-key").inner_text()
    me = httpx.get(f"{console.url}/v1/me", headers=bearer(key)).json()
    assert me["tenant"] == "soylent" and me["key_name"] == "soylent-app"
    chat = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{console.url}/v1/chat/completions", json=chat, headers=bearer(key),
                      timeout=CODE_TIMEOUT_S).status_code == 200
    page.reload()
    usage = page.get_by_role("table", name="Usage by adapter")
    expect(usage.get_by_role("row").filter(has_text="base").get_by_role("cell").nth(1)).to_have_text("1")

    page.get_by_role("button", name="Suspend tenant").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Suspend").click()
    expect(page.get_by_test_id("tenant-state")).to_have_text("suspended")
    refused = httpx.get(f"{console.url}/v1/me", headers=bearer(key))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_suspended"
    page.get_by_role("button", name="Resume tenant").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Resume").click()
    expect(page.get_by_test_id("tenant-state")).to_have_text("active")
    assert httpx.get(f"{console.url}/v1/me", headers=bearer(key)).status_code == 200

    page.get_by_role("table", name="Keys").get_by_role("link", name="soylent-app").click()
    expect(page.get_by_role("heading", name="Key soylent-app")).to_be_visible()
    page.get_by_role("button", name="Revoke").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Revoke").click()
    expect(page.get_by_test_id("key-state")).to_contain_text("revoked")
    assert httpx.get(f"{console.url}/v1/me", headers=bearer(key)).status_code == 401
    page.get_by_role("link", name="← Tenant soylent").click()
    expect(page.get_by_role("table", name="Keys").get_by_role("row").filter(has_text="soylent-app")).to_contain_text("revoked")
    assert not console_page.unexpected_errors()


def test_the_playground_chats_over_turns_with_a_system_prompt_and_its_code_runs(console, console_page):
    key = console.keys["acme-developer"]
    console_page.sign_in(key)
    page = console_page.page
    page.get_by_role("link", name="Playground").click()
    base = next(model["id"] for model in httpx.get(f"{console.url}/v1/models", headers=bearer(key)).json()["data"]
                if model["parent"] is None)
    page.get_by_label("Pick a model").select_option(base)  # the list /v1/models gave
    expect(page.get_by_label("Model reference", exact=True)).to_have_value(base)
    page.get_by_label("System message").fill("You answer in one word.")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("6")
    conversation = page.get_by_role("list", name=f"Conversation with {base}")
    for turn, question in enumerate(("Name a colour.", "Another one?"), start=1):
        page.get_by_label("Prompt").fill(question)
        page.get_by_role("button", name="Send").click()
        expect(conversation.get_by_role("listitem")).to_have_count(turn)
        expect(page.get_by_test_id("finish-0")).to_be_visible()  # the latest answer's
    expect(page.get_by_test_id("latency-0")).to_have_text(re.compile(r"^first token [\d.]+ (ms|s), total [\d.]+ (ms|s)$"))
    tokens = re.fullmatch(r"(\d+) prompt \+ (\d+) completion tokens", page.get_by_test_id("tokens-0").inner_text())
    assert tokens is not None
    # The second turn's prompt holds the system prompt and the first exchange: more than the question alone.
    assert int(tokens[1]) > 20 and 1 <= int(tokens[2]) <= 6

    page.get_by_role("button", name="Copy as Python").click()
    script = page.get_by_test_id("copied-code").inner_text()
    assert key not in script  # the key comes from the environment
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=CODE_TIMEOUT_S,
                         env={**os.environ, "LORALOOM_API_KEY": key})
    assert ran.returncode == 0, ran.stderr  # the SDK took every argument and the server answered
    assert ran.stdout.endswith("\n")  # the answer printed

    page.get_by_role("button", name="Copy as curl").click()
    command = page.get_by_test_id("copied-code").inner_text()
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=CODE_TIMEOUT_S,
                         env={**os.environ, "LORALOOM_API_KEY": key})
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert answer["object"] == "chat.completion" and answer["model"] == base
    # The conversation as sent: the system prompt, both questions and both answers, in order.
    assert answer["usage"]["prompt_tokens"] >= int(tokens[1])
    body = json.loads(command[command.index("-d '") + 4:-1].replace("'\\''", "'"))
    assert [message["role"] for message in body["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert body["messages"][0]["content"] == "You answer in one word."
    assert not console_page.unexpected_errors()


def test_the_server_page_shows_speculative_decoding_for_the_tenant_and_the_operator(console, console_page):
    passage = ("Our office opens at nine, closes at five, and is closed on public holidays; parcels are "
               "collected at noon from the front desk by the courier.")
    with httpx.Client(base_url=console.url, headers=bearer(console.keys["acme-developer"]), timeout=300) as http:
        answer = http.post("/v1/chat/completions", json={
            "model": "base", "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": f"Repeat this text exactly: {passage}"}]})
        assert answer.status_code == 200, answer.text
        mine = http.get("/v1/engine/status").json()["speculation"]
    assert any(line["model"] == "base" and line["accepted_tokens"] > 0 for line in mine), mine

    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    page.get_by_role("link", name="Server").click()
    base_cell = page.get_by_role("cell", name="base", exact=True)
    own = page.get_by_role("table", name="Your speculative decoding")
    expect(own.get_by_role("row").filter(has=base_cell)).to_contain_text("%")
    expect(own.get_by_role("columnheader", name="Tenant")).to_have_count(0)

    page.get_by_role("button", name="Sign out").click()
    console_page.sign_in(console.keys["default-admin"])
    page.get_by_role("link", name="Server").click()
    expect(page.get_by_text("Draft acceptance")).to_be_visible()
    every = page.get_by_role("table", name="Speculative decoding by model")
    expect(every.get_by_role("row").filter(has_text="acme").filter(has=base_cell)).to_contain_text("%")
    assert not console_page.unexpected_errors()
