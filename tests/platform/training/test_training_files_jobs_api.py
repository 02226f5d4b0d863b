"""/v1/files and /v1/fine_tuning/jobs without a worker: uploads validated against the served
base (a 400 with the line-numbered report, nothing stored), tenant scoping, content,
deletion, and job creation refusing bad input with the field at fault; a queued job is
cancelled without running, lists paginate with `after`."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from product_codes import product_dataset
from training_live import TrainingServer, all_events, training_server, training_settings, upload

from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.job_state import add_event

CHAT_LINE = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingServer]:
    # No worker consumes this embedded broker: jobs stay queued.
    with training_server(model_dir, training_settings(tmp_path_factory.mktemp("files-jobs"))) as live:
        yield live


def stored_blobs(server: TrainingServer) -> list[Path]:
    return sorted(p for p in (server.settings.data_dir / "blobs").rglob("*") if p.is_file())


def test_upload_list_get_content_delete(server: TrainingServer) -> None:
    lines = product_dataset()[:5]
    with server.http() as client:
        uploaded = upload(client, lines, filename="products.jsonl")
        assert uploaded["object"] == "file" and uploaded["id"].startswith("file-")
        assert (uploaded["filename"], uploaded["line_count"], uploaded["status"]) == ("products.jsonl", 5, "processed")
        content = b"\n".join(json.dumps(line).encode() for line in lines)
        assert uploaded["bytes"] == len(content)
        assert client.get(f"/v1/files/{uploaded['id']}").json() == uploaded
        assert client.get(f"/v1/files/{uploaded['id']}/content").content == content
        assert uploaded["id"] in [f["id"] for f in client.get("/v1/files").json()["data"]]
        with server.http("globex-developer") as other:  # another tenant's file does not exist for them
            assert other.get(f"/v1/files/{uploaded['id']}").status_code == 404
            assert other.delete(f"/v1/files/{uploaded['id']}").status_code == 404
        deleted = client.delete(f"/v1/files/{uploaded['id']}")
        assert deleted.json() == {"id": uploaded["id"], "object": "file", "deleted": True}
        assert client.get(f"/v1/files/{uploaded['id']}").status_code == 404


BAD_UPLOADS = [
    # (file bytes, purpose, expected param, expected code, expected (line, reason) pairs)
    (b'{"text": "fine"}\nnot json\n{"prompt": "a", "completion": "b"}\n', "fine-tune", "file",
     "invalid_training_file", [(2, "invalid_json"), (3, "mixed_formats")]),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), "fine-tune", "file",
     "invalid_training_file", [(1, "invalid_role")]),
    (b"", "fine-tune", "file", "invalid_training_file", [(None, "empty_file")]),
    (json.dumps({"text": "word " * 3000}).encode(), "fine-tune", "file", "invalid_training_file", [(1, "too_long")]),
    (json.dumps(CHAT_LINE).encode(), "assistants", "purpose", "invalid_purpose", []),
]


@pytest.mark.parametrize("data,purpose,param,code,lines", BAD_UPLOADS)
def test_bad_uploads_are_refused_with_the_report_and_store_nothing(
    server: TrainingServer, data: bytes, purpose: str, param: str, code: str, lines: list
) -> None:
    with server.http() as client:
        before = (stored_blobs(server), client.get("/v1/files").json()["data"])
        response = client.post("/v1/files", data={"purpose": purpose}, files={"file": ("bad.jsonl", data)})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
        if lines:
            report = error["details"]["report"]
            assert [(e["line"], e["reason"]) for e in report["errors"]] == lines
            assert report["num_errors"] == len(lines)
        assert (stored_blobs(server), client.get("/v1/files").json()["data"]) == before


def test_uploads_need_a_developer_key(server: TrainingServer) -> None:
    with server.http("acme-inference") as client:
        response = client.post("/v1/files", data={"purpose": "fine-tune"},
                               files={"file": ("a.jsonl", json.dumps(CHAT_LINE).encode())})
    assert response.status_code == 403


def test_job_creation_refuses_bad_input_naming_the_field(server: TrainingServer) -> None:
    with server.http() as client:
        file_id = upload(client, [CHAT_LINE])["id"]
        with server.http("globex-developer") as other:
            foreign = upload(other, [CHAT_LINE])["id"]
        good = {"model": server.model_name, "training_file": file_id, "suffix": "bot"}
        cases = [
            ({"model": "gpt-4o"}, "model", "model_not_available"),
            ({"training_file": "file-missing"}, "training_file", "file_not_found"),
            ({"training_file": foreign}, "training_file", "file_not_found"),
            ({"validation_file": "file-missing"}, "validation_file", "file_not_found"),
            ({"suffix": "bad name!"}, "suffix", "invalid_suffix"),
            ({"suffix": server.model_name}, "suffix", "invalid_suffix"),
            ({"hyperparameters": {"learning_rate": 5}}, "hyperparameters.learning_rate", None),
            ({"hyperparameters": {"n_epochs": "3"}}, "hyperparameters.n_epochs", None),
            ({"hyperparameters": {"target_modules": ["lm_head"]}}, "hyperparameters.target_modules", None),
            ({"hyperparameters": {"lora_r": 32}}, "hyperparameters.lora_r", "invalid_hyperparameters"),
            ({"hyperparameters": {"max_seq_len": 16}}, "hyperparameters.max_seq_len", "invalid_hyperparameters"),
            ({"epochs": 3}, "epochs", None),
        ]
        for change, param, code in cases:
            response = client.post("/v1/fine_tuning/jobs", json={**good, **change})
            assert response.status_code == 400, (change, response.text)
            error = response.json()["error"]
            assert error["param"] == param, (change, error)
            if code is not None:
                assert error["code"] == code, (change, error)
        assert client.get("/v1/fine_tuning/jobs").json()["data"] == []  # nothing was created


def test_a_queued_job_is_cancelled_without_running_and_lists_paginate(server: TrainingServer) -> None:
    with server.http() as client:
        file_id = upload(client, [CHAT_LINE])["id"]
        body = {"model": server.model_name, "training_file": file_id, "suffix": "queued-bot", "seed": 7}
        created = [client.post("/v1/fine_tuning/jobs", json=body).json() for _ in range(3)]
        assert [job["status"] for job in created] == ["queued"] * 3
        assert created[0]["hyperparameters"]["n_epochs"] == 3 and created[0]["seed"] == 7

        first = client.get("/v1/fine_tuning/jobs", params={"limit": 2}).json()
        rest = client.get("/v1/fine_tuning/jobs", params={"limit": 2, "after": first["data"][-1]["id"]}).json()
        assert first["has_more"] and not rest["has_more"]
        assert [job["id"] for job in first["data"] + rest["data"]] == [job["id"] for job in reversed(created)]

        # A file a queued job reads cannot be deleted under it.
        assert client.delete(f"/v1/files/{file_id}").status_code == 409
        cancelled = client.post(f"/v1/fine_tuning/jobs/{created[0]['id']}/cancel").json()
        assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
        messages = [event["message"] for event in all_events(client, created[0]["id"])]
        assert messages[-1] == "The job was cancelled before it ran"
        newest = client.get(f"/v1/fine_tuning/jobs/{created[0]['id']}/events", params={"limit": 1}).json()
        assert newest["has_more"] and newest["data"][0]["message"] == messages[-1]
        with server.http("globex-developer") as other:
            assert other.get(f"/v1/fine_tuning/jobs/{created[1]['id']}").status_code == 404
            assert other.post(f"/v1/fine_tuning/jobs/{created[1]['id']}/cancel").status_code == 404


LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script


def run_cli(server: TrainingServer, *args: str) -> subprocess.CompletedProcess:
    # Output piped and no COLUMNS/LINES: a CI log, where the terminal's width is unknown.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("LORALOOM_") and name not in ("COLUMNS", "LINES")}
    env.update(LORALOOM_BASE_URL=server.url, LORALOOM_API_KEY=server.keys["acme-developer"])
    return subprocess.run([str(LORALOOM), *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_uploads_creates_cancels_and_follows(server: TrainingServer, tmp_path: Path) -> None:
    good = tmp_path / "train.jsonl"
    good.write_text("\n".join(json.dumps(line) for line in product_dataset()[:3]))
    uploaded = run_cli(server, "files", "upload", str(good))
    assert uploaded.returncode == 0, uploaded.stderr
    file_id = uploaded.stdout.strip()
    assert file_id.startswith("file-") and "3 examples" in uploaded.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"text": " "}\n')
    refused = run_cli(server, "files", "upload", str(bad))
    assert refused.returncode == 1 and "line 1: not valid JSON" in refused.stderr
    assert "line 2: text is empty" in refused.stderr

    created = run_cli(server, "jobs", "create", "--training-file", file_id, "--suffix", "cli-bot", "--n-epochs", "2",
                      "--target-modules", "q_proj,v_proj")
    assert created.returncode == 0, created.stderr
    job_id = created.stdout.strip()
    with server.http() as client:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert (job["model"], job["status"], job["hyperparameters"]["n_epochs"]) == (server.model_name, "queued", 2)
    assert job["hyperparameters"]["target_modules"] == ["q_proj", "v_proj"]
    assert job_id in run_cli(server, "jobs", "list").stdout

    cancelled = run_cli(server, "jobs", "cancel", job_id)
    assert cancelled.returncode == 0 and f"{job_id}: cancelled" in cancelled.stderr
    followed = run_cli(server, "jobs", "follow", job_id)  # a finished job: its events, then how it ended
    assert followed.returncode == 1 and "The job was cancelled before it ran" in followed.stderr
    assert f"{job_id} cancelled" in followed.stderr


def test_cli_file_and_job_listings_print_the_api_s_items_as_json(server: TrainingServer) -> None:
    with server.http() as client:
        file_id = upload(client, product_dataset()[:3])["id"]
        job = client.post("/v1/fine_tuning/jobs", json={"model": server.model_name, "training_file": file_id,
                                                        "suffix": "listed"})
        assert job.status_code == 200, job.text
        for command, path in ((("files", "list"), "/v1/files"), (("jobs", "list"), "/v1/fine_tuning/jobs")):
            listed = run_cli(server, *command, "--json")
            assert listed.returncode == 0, listed.stderr
            assert json.loads(listed.stdout) == client.get(path, params={"limit": 100}).json()["data"], command
        client.post(f"/v1/fine_tuning/jobs/{job.json()['id']}/cancel")


def test_jobs_create_help_shows_the_server_s_defaults(server: TrainingServer) -> None:
    shown = run_cli(server, "jobs", "create", "--help")
    assert shown.returncode == 0, shown.stderr
    help_text = "".join(shown.stdout.split())  # argparse wraps help anywhere at the (unknown) terminal's width
    for name, default in Hyperparameters().model_dump().items():
        value = ",".join(default) if isinstance(default, list) else str(default)
        assert f"--{name.replace('_', '-')}" in help_text
        assert f"Default:{value}." in help_text, name


def test_following_a_job_with_piped_output_and_no_known_width(server: TrainingServer) -> None:
    with server.http() as client:
        file_id = upload(client, product_dataset()[:3])["id"]
        job_id = client.post("/v1/fine_tuning/jobs", json={"model": server.model_name, "training_file": file_id,
                                                           "suffix": "followed"}).json()["id"]
        assert client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    # The events a run writes as it trains (job_state.add_event, as the worker calls it).
    engine = create_db_engine(server.settings.database_url)
    try:
        with create_session_factory(engine).begin() as session:
            for step, loss in ((1, 2.5), (2, 1.25)):
                add_event(session, job_id, f"Step {step}/2", type="metrics",
                          data={"step": step, "total_steps": 2, "train_loss": loss, "eta_seconds": 2.0 - step})
    finally:
        engine.dispose()
    followed = run_cli(server, "jobs", "follow", job_id)
    assert followed.returncode == 1 and "Traceback" not in followed.stderr, followed.stderr
    lines = followed.stderr.splitlines()
    assert "step 1/2 loss=2.5000 eta=1s" in lines and "step 2/2 loss=1.2500 eta=0s" in lines
    assert "\r" not in followed.stderr  # no bar redrawn over itself in a log
    assert f"{job_id} cancelled" in followed.stderr and followed.stdout == ""


def test_openai_spelling_base_as_model_and_a_generated_suffix(server: TrainingServer) -> None:
    """What the official SDK sends for OpenAI: `model: "base"`, no suffix, "auto" and learning_rate_multiplier."""
    import openai

    with server.http() as client:
        file_id = upload(client, [CHAT_LINE])["id"]
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["acme-developer"], max_retries=0)
    job = sdk.fine_tuning.jobs.create(model="base", training_file=file_id, hyperparameters={
        "n_epochs": "auto", "batch_size": 4, "learning_rate_multiplier": 2,
    }).to_dict()
    defaults = Hyperparameters()
    assert job["model"] == server.model_name
    assert re.fullmatch(r"ft-[0-9a-f]{8}", job["suffix"]), job["suffix"]
    assert (job["hyperparameters"]["n_epochs"], job["hyperparameters"]["batch_size"]) == (defaults.n_epochs, 4)
    assert job["hyperparameters"]["learning_rate"] == 2 * defaults.learning_rate
    other = sdk.fine_tuning.jobs.create(model="base", training_file=file_id).to_dict()
    assert other["suffix"] != job["suffix"]  # each job without a suffix gets an adapter of its own
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.fine_tuning.jobs.create(model="base", training_file=file_id, hyperparameters={"epochs": 2})
    assert refused.value.param == "hyperparameters.epochs" and "use n_epochs" in refused.value.message
    for created in (job, other):
        sdk.fine_tuning.jobs.cancel(created["id"])
