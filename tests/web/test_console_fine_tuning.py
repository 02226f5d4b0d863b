"""The console's fine-tuning controls on a live server: a running job paused from its page (it keeps a
checkpoint), its checkpoint's links (chat with it; start a job from it, which opens the job form filled
from the job with the checkpoint to start from and the server's estimate), and resumed; and a DPO
preference file uploaded through the dataset form, chosen with the DPO method, estimated, and refused
by the estimate for a chat file."""
from __future__ import annotations

import json
import re

import httpx
from live_api import bearer
from playwright.sync_api import expect

KEY = "initech-developer"  # a tenant whose jobs no other browser test counts
# The job would run for minutes: it is paused after a step or more, and cancelled at the end.
HYPERPARAMETERS = {"n_epochs": 50, "batch_size": 2, "lora_r": 4, "max_seq_len": 64, "learning_rate": 0.001}
JOB_TIMEOUT_MS = 600_000  # the worker loads the model for the job on two shared, busy cores
SOME_STEPS = re.compile(r"^[1-9][0-9]*$")
TOKENS = re.compile(r"^[1-9][0-9,.\s]*$")
CHAT = [{"messages": [{"role": "user", "content": f"Shelf of book {n}?"}, {"role": "assistant", "content": f"SHELF-{n}"}]}
        for n in range(8)]
PREFERENCES = [
    {"input": {"messages": [{"role": "user", "content": f"Greet visitor {n}."}]},
     "preferred_output": [{"role": "assistant", "content": f"Welcome, visitor {n}!"}],
     "non_preferred_output": [{"role": "assistant", "content": "What do you want?"}]}
    for n in range(6)
]


def start_job(http: httpx.Client) -> str:
    data = "\n".join(json.dumps(line) for line in CHAT).encode()
    dataset = http.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("shelves.jsonl", data)})
    assert dataset.status_code == 200, dataset.text
    base = next(model["id"] for model in http.get("/v1/models").json()["data"] if model["parent"] is None)
    job = http.post("/v1/fine_tuning/jobs", json={"model": base, "training_file": dataset.json()["id"], "suffix": "shelves",
                                                  "seed": 1, "hyperparameters": HYPERPARAMETERS})
    assert job.status_code == 200, job.text
    return job.json()["id"]


def test_pause_a_running_job_start_another_from_its_checkpoint_and_resume_it(console, console_page):
    http = httpx.Client(base_url=console.url, headers=bearer(console.keys[KEY]), timeout=120)
    job_id = start_job(http)
    try:
        console_page.sign_in(console.keys[KEY])
        page = console_page.page
        console_page.open(f"/console/training/{job_id}")
        expect(page.get_by_role("heading", name=job_id)).to_be_visible()
        # Paused once it has trained a step or more, so that its checkpoint holds work.
        expect(page.get_by_role("img", name="Loss per step")).to_have_attribute("data-points", SOME_STEPS,
                                                                               timeout=JOB_TIMEOUT_MS)
        expect(page.get_by_role("button", name="Resume")).to_have_count(0)  # a running job is not resumable
        page.get_by_role("button", name="Pause").click()
        expect(page.get_by_test_id("job-status")).to_have_text("paused", timeout=JOB_TIMEOUT_MS)
        expect(page.get_by_role("button", name="Pause")).to_have_count(0)
        expect(page.get_by_role("list", name="Events")).to_contain_text(re.compile("paused", re.IGNORECASE))

        checkpoint = page.get_by_role("list", name="Checkpoints").get_by_role("listitem").first
        reference = checkpoint.locator("code").inner_text()
        assert reference.startswith("ftckpt-")
        expect(checkpoint).to_contain_text("train loss")
        chat = checkpoint.get_by_role("link", name="chat with this checkpoint")
        assert chat.get_attribute("href").endswith(f"/playground?model={reference}")
        checkpoint.get_by_role("link", name="start a job from here").click()
        form = page.get_by_role("form", name="Start a training job")
        expect(form.get_by_label("Start from checkpoint")).to_have_value(reference)
        expect(form.get_by_label("Adapter name")).to_have_value("shelves")
        expect(form.get_by_label("lora_r", exact=True)).to_have_value("4")  # the checkpoint's rank: the job's
        expect(form.get_by_label("Training file")).to_have_value(http.get(f"/v1/fine_tuning/jobs/{job_id}").json()["training_file"])
        # The server's estimate of the job, before it is started (n_epochs 50 of 8 examples, 2 per step).
        estimate = form.get_by_role("group", name="Estimate")
        expect(estimate.get_by_test_id("estimate-tokens")).to_have_text(TOKENS)
        expect(estimate).to_contain_text("200 steps")

        page.go_back()
        expect(page.get_by_test_id("job-status")).to_have_text("paused")
        page.get_by_role("button", name="Resume").click()
        expect(page.get_by_test_id("job-status")).not_to_have_text("paused")
        expect(page.get_by_role("button", name="Pause")).to_be_visible()  # queued or running again
        expect(page.get_by_role("list", name="Events")).to_contain_text(re.compile("resum", re.IGNORECASE))
        assert not console_page.unexpected_errors()
    finally:
        http.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")  # frees the worker for the other tests
        http.close()


def test_a_dpo_file_is_uploaded_estimated_with_the_dpo_method_and_a_chat_file_refused_for_it(console, console_page, tmp_path):
    preferences = tmp_path / "greetings.jsonl"
    preferences.write_text("\n".join(json.dumps(line) for line in PREFERENCES) + "\n")
    chat = tmp_path / "chat-shelves.jsonl"
    chat.write_text("\n".join(json.dumps(line) for line in CHAT) + "\n")
    console_page.sign_in(console.keys[KEY])
    page = console_page.page
    page.get_by_role("link", name="Training").click()
    for dataset in (chat, preferences):
        page.get_by_label("Dataset file").set_input_files(str(dataset))
        page.get_by_role("button", name="Upload dataset").click()
        expect(page.get_by_role("status").filter(has_text="accepted")).to_contain_text(dataset.name)
    accepted = page.get_by_role("status").filter(has_text="accepted")
    expect(accepted.get_by_test_id("dataset-format")).to_have_text("preference")
    expect(accepted).to_contain_text("for DPO jobs")
    expect(accepted).to_contain_text("6 examples")

    form = page.get_by_role("form", name="Start a training job")
    expect(form.get_by_label("beta")).to_have_count(0)  # a supervised job has no beta
    form.get_by_label("DPO").check()
    expect(form.get_by_label("beta")).to_have_value("0.1")  # the server's default, from its OpenAPI document
    training = form.get_by_label("Training file")
    training.select_option(training.locator("option", has_text="greetings.jsonl").get_attribute("value"))
    form.get_by_label("Adapter name").fill("greeter")
    tokens = form.get_by_role("group", name="Estimate").get_by_test_id("estimate-tokens")
    form.get_by_label("n_epochs", exact=True).fill("1")
    expect(tokens).to_have_text(TOKENS)
    one_epoch = int(re.sub(r"\D", "", tokens.inner_text()))
    form.get_by_label("n_epochs", exact=True).fill("2")
    # Every epoch trains the file's tokens: twice as many (in the locale's digit grouping).
    expect(tokens).to_have_text(re.compile("^" + r"[,.\s]?".join(str(2 * one_epoch)) + "$"))

    training.select_option(training.locator("option", has_text="chat-shelves.jsonl").get_attribute("value"))
    refusal = form.get_by_role("group", name="Estimate").get_by_role("alert")
    expect(refusal).to_contain_text("training_file")
    expect(refusal).to_contain_text("preference")
    form.get_by_label("Metadata").fill("no equals sign")
    expect(form.get_by_role("alert").filter(has_text="metadata line 1")).to_be_visible()
    expect(form.get_by_role("button", name="Start training")).to_be_disabled()
    assert not console_page.unexpected_errors("status of 400")
