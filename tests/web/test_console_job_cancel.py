"""Cancelling a running training job from its console page: the confirm dialog, the job ending
`cancelled`, and the checkpoint it saved on the way out answering in the playground."""
from __future__ import annotations

import json
import re

import httpx
from live_api import bearer
from playwright.sync_api import expect

KEY = "umbrella-developer"
# The job would run for minutes: it is cancelled long before it could end by itself.
HYPERPARAMETERS = {"n_epochs": 50, "batch_size": 2, "lora_r": 4, "max_seq_len": 64, "learning_rate": 0.001}
JOB_TIMEOUT_MS = 600_000  # the worker loads the model for the job on two shared, busy cores
SOME_STEPS = re.compile(r"^[1-9][0-9]*$")
LINES = [
    {"messages": [{"role": "user", "content": f"Colour of box {n}?"}, {"role": "assistant", "content": f"BOX-{n}"}]}
    for n in range(8)
]


def start_job(url: str, key: str) -> str:
    with httpx.Client(base_url=url, headers=bearer(key), timeout=120) as http:
        data = "\n".join(json.dumps(line) for line in LINES).encode()
        dataset = http.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("boxes.jsonl", data)})
        assert dataset.status_code == 200, dataset.text
        base = next(model["id"] for model in http.get("/v1/models").json()["data"] if model["parent"] is None)
        job = http.post("/v1/fine_tuning/jobs", json={"model": base, "training_file": dataset.json()["id"],
                                                      "suffix": "boxes", "seed": 1, "hyperparameters": HYPERPARAMETERS})
        assert job.status_code == 200, job.text
        return job.json()["id"]


def test_cancel_a_running_job_then_chat_with_its_checkpoint(console, console_page):
    job_id = start_job(console.url, console.keys[KEY])
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    page.get_by_role("link", name="Training").click()
    page.get_by_role("link", name=job_id).click()
    expect(page.get_by_role("heading", name=job_id)).to_be_visible()
    # Cancel once it has trained a step or more, so that there is work to keep as a checkpoint.
    expect(page.get_by_role("img", name="Loss per step")).to_have_attribute("data-points", SOME_STEPS,
                                                                           timeout=JOB_TIMEOUT_MS)
    page.get_by_role("button", name="Cancel job").click()
    dialog = page.get_by_role("alertdialog", name=re.compile("Cancel this job"))
    dialog.get_by_role("button", name="Cancel job").click()
    expect(dialog).to_have_count(0)
    expect(page.get_by_test_id("job-status")).to_have_text("cancelled", timeout=JOB_TIMEOUT_MS)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)  # nothing left to cancel
    expect(page.get_by_role("list", name="Events")).to_contain_text("cancel")

    checkpoint = page.get_by_role("list", name="Checkpoints").get_by_role("listitem").first
    reference = checkpoint.locator("code").inner_text()
    checkpoint.get_by_role("link", name="chat").click()
    expect(page.get_by_label("Model reference", exact=True)).to_have_value(reference)
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("6")
    page.get_by_label("Prompt").fill("Colour of box 3?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("finish-0")).to_be_visible()  # the checkpoint's stream ended without an error
    expect(page.get_by_role("article", name=f"Answer from {reference}").get_by_role("alert")).to_have_count(0)
    expect(page.get_by_test_id("answer-0")).not_to_be_empty()
    assert not console_page.unexpected_errors()
