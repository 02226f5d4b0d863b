"""Training from the console: a refused dataset shows its line-numbered report; a small dataset is
accepted; a job started from the form shows its loss chart gaining points while it runs, its step,
time left and validation loss as they come, ends succeeded with its progress and file names in the
jobs list, links to the version it made, and that version answers in the playground."""
from __future__ import annotations

import json
import re

from console_live import CHECKPOINT_EVERY
from playwright.sync_api import expect

# A real training run on two shared, busy cores; under pytest-timeout's 900 s per test, so that a
# stuck job fails here with what the page showed.
JOB_TIMEOUT_MS = 600_000
# Evaluated with each checkpoint (eval_interval), so that validation loss comes while the job runs.
EVAL_EVERY = CHECKPOINT_EVERY
# 8 examples / 2 per step x 5 epochs: long enough (~1 s a step) to watch it run, with one evaluation
# before its end; each step is CPU the other tests running beside this one wait for.
EPOCHS, STEPS = 5, 20
PART_OF_THE_STEPS = re.compile(r"^([1-9]|1[0-9])$")  # 1 to STEPS - 1 points: drawn while it runs
LINES = [
    {"messages": [{"role": "user", "content": f"Code for item {n}?"}, {"role": "assistant", "content": f"ITEM-{n:03d}"}]}
    for n in range(8)
]


def test_dataset_report_then_a_job_with_a_live_loss_chart_to_a_version_that_answers(console, console_page, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(LINES[0]) + "\n{not json\n" + json.dumps({"messages": []}) + "\n")
    good = tmp_path / "codes.jsonl"
    good.write_text("\n".join(json.dumps(line) for line in LINES) + "\n")

    console_page.sign_in(console.keys["acme-developer"])
    page = console_page.page
    page.get_by_role("link", name="Training").click()
    page.get_by_label("Dataset file").set_input_files(str(bad))
    page.get_by_role("button", name="Upload dataset").click()
    report = page.get_by_role("table", name="Dataset validation report")
    expect(report.get_by_role("row")).to_have_count(3)  # header + lines 2 and 3
    expect(report.get_by_role("row").nth(1).get_by_role("cell").first).to_have_text("2")
    expect(report.get_by_role("row").nth(2).get_by_role("cell").first).to_have_text("3")

    page.get_by_label("Dataset file").set_input_files(str(good))
    page.get_by_role("button", name="Upload dataset").click()
    expect(page.get_by_role("status").filter(has_text="accepted")).to_contain_text("8 examples")

    form = page.get_by_role("form", name="Start a training job")
    expect(form.get_by_label("Training file")).to_contain_text("codes.jsonl")
    validation = form.get_by_label("Validation file")
    validation.select_option(validation.locator("option", has_text="codes.jsonl").get_attribute("value"))
    form.get_by_label("Adapter name").fill("codes")
    form.get_by_label("Seed").fill("7")
    expect(form.get_by_label("n_epochs")).to_have_value("3")  # the server's default, from its OpenAPI document
    for field, value in {"n_epochs": str(EPOCHS), "batch_size": "2", "lora_r": "4", "max_seq_len": "64",
                         "learning_rate": "0.001", "eval_interval": str(EVAL_EVERY)}.items():
        form.get_by_label(field, exact=True).fill(value)
    form.get_by_role("button", name="Start training").click()

    chart = page.get_by_role("img", name="Loss per step")
    # The page polls while the job runs: it draws some of the steps before the job has them all...
    expect(chart).to_have_attribute("data-points", PART_OF_THE_STEPS, timeout=JOB_TIMEOUT_MS)
    # Progress while it runs: the step of the total, with the time left.
    expect(page.get_by_test_id("job-step")).to_contain_text(f"of {STEPS}")
    expect(page.get_by_role("definition").filter(has_text=re.compile(r"^\d+ (s|min|h)"))).not_to_have_count(0)
    # Validation loss at each evaluation as it comes (every EVAL_EVERY steps), before the end...
    evaluated = page.get_by_test_id("eval-points")
    expect(evaluated).to_have_attribute("data-count", re.compile(f"^[1-{STEPS // EVAL_EVERY - 1}]$"),
                                        timeout=JOB_TIMEOUT_MS)
    expect(page.get_by_test_id("job-status")).to_have_text("succeeded", timeout=JOB_TIMEOUT_MS)
    expect(chart).to_have_attribute("data-points", str(STEPS))  # ...and every one once it ends
    # The token accuracy beside the loss, every step.
    expect(page.get_by_role("img", name="Accuracy per step")).to_have_attribute("data-points", str(STEPS))
    expect(evaluated).to_have_attribute("data-count", str(STEPS // EVAL_EVERY))
    expect(page.get_by_role("definition").filter(has_text="codes.jsonl")).to_have_count(2)  # training, validation
    job_id = page.get_by_role("heading", level=1).inner_text()

    page.get_by_role("link", name="← Training").click()
    row = page.get_by_role("table", name="Jobs").get_by_role("row").filter(has_text=job_id)
    expect(row.get_by_test_id("job-progress")).to_contain_text(f"{STEPS}/{STEPS}")
    expect(row.get_by_test_id("job-progress")).to_contain_text("tok/s")
    expect(row.get_by_test_id("job-progress")).not_to_contain_text("ETA")  # it has ended
    expect(row).to_contain_text("codes.jsonl")
    row.get_by_role("link", name=job_id).click()
    expect(page.get_by_role("list", name="Events")).to_contain_text("training loss")

    page.get_by_test_id("produced-version").click()
    versions = page.get_by_role("table", name="Versions")
    expect(versions).to_contain_text("training job ftjob")
    page.go_back()
    page.get_by_role("link", name="chat with it").click()
    expect(page.get_by_label("Model reference", exact=True)).to_have_value("codes@1")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("8")
    page.get_by_label("Prompt").fill("Code for item 3?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("finish-0")).to_be_visible()  # the stream from codes@1 ended without an error
    expect(page.get_by_role("article", name="Answer from codes@1").get_by_role("alert")).to_have_count(0)
    assert not console_page.unexpected_errors("status of 400")
