"""Issue 40's job API without a worker: `method` (OpenAI's shape, supervised or DPO), `metadata`,
`early_stopping`, `from_checkpoint` and `promote` in the create body, each refusal naming its field; the
estimate of a job before it is created; pause and resume of a queued job (409 in a wrong state);
and the CLI's estimate, pause, resume and --promote-alias."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from product_codes import product_dataset
from test_training_files_jobs_api import run_cli
from training_live import TrainingServer, all_events, training_server, training_settings, upload

from loraloom.platform.training.hyperparameters import Hyperparameters

CHAT_LINE = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
PREFERENCE_LINE = {"input": {"messages": [{"role": "user", "content": "Hi"}]},
                   "preferred_output": [{"role": "assistant", "content": "Hello."}],
                   "non_preferred_output": [{"role": "assistant", "content": "Go away."}]}


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingServer]:
    # No worker consumes this embedded broker: jobs stay queued.
    with training_server(model_dir, training_settings(tmp_path_factory.mktemp("job-options"))) as live:
        yield live


@pytest.fixture(scope="module")
def files(server: TrainingServer) -> dict[str, str]:
    with server.http() as client:
        return {"chat": upload(client, [CHAT_LINE] * 3)["id"], "preference": upload(client, [PREFERENCE_LINE] * 2)["id"]}


def test_method_metadata_and_early_stopping_are_stored_and_returned(server: TrainingServer, files) -> None:
    with server.http() as client:
        created = client.post("/v1/fine_tuning/jobs", json={
            "model": "base", "training_file": files["chat"], "validation_file": files["chat"],
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "eval_interval": 3}}},
            "metadata": {"team": "search", "ticket": "x" * 512}, "early_stopping": {"patience": 2},
        })
        assert created.status_code == 200, created.text
        job = created.json()
        assert job["model"] == server.model_name and job["suffix"].startswith("ft-")  # `base`, no suffix: accepted
        assert job["method"] == {"type": "supervised", "supervised": {"hyperparameters": job["hyperparameters"]}}
        assert (job["hyperparameters"]["n_epochs"], job["hyperparameters"]["eval_interval"]) == (2, 3)
        assert job["metadata"] == {"team": "search", "ticket": "x" * 512}
        assert (job["early_stopping"], job["from_checkpoint"], job["promote"]) == ({"patience": 2}, None, None)
        assert client.get(f"/v1/fine_tuning/jobs/{job['id']}").json() == job

        dpo = client.post("/v1/fine_tuning/jobs", json={
            "model": server.model_name, "training_file": files["preference"],
            "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.25}}},
        }).json()
        assert dpo["method"]["type"] == "dpo" and dpo["method"]["dpo"]["hyperparameters"]["beta"] == 0.25
        assert dpo["metadata"] is None and dpo["early_stopping"] is None

        top_level = client.post("/v1/fine_tuning/jobs", json={
            "model": "base", "training_file": files["chat"], "hyperparameters": {"n_epochs": 4}}).json()
        assert top_level["method"]["type"] == "supervised" and top_level["hyperparameters"]["n_epochs"] == 4

        gated = client.post("/v1/fine_tuning/jobs", json={
            "model": "base", "training_file": files["chat"], "validation_file": files["chat"],
            "promote": {"alias": "prod"}}).json()
        assert gated["promote"] == {"alias": "prod", "when": "valid_loss_improves"}
        assert client.get(f"/v1/fine_tuning/jobs/{gated['id']}").json()["promote"] == gated["promote"]
        for made in (job, dpo, top_level, gated):
            client.post(f"/v1/fine_tuning/jobs/{made['id']}/cancel")


def test_bad_options_are_refused_naming_the_field_by_create_and_estimate_alike(server: TrainingServer, files) -> None:
    good = {"model": "base", "training_file": files["chat"]}
    cases = [
        ({"hyperparameters": {"n_epochs": 2}, "method": {"type": "supervised",
                                                         "supervised": {"hyperparameters": {"n_epochs": 3}}}},
         400, "hyperparameters"),
        ({"hyperparameters": {"n_epochs": 2}, "method": {"type": "dpo"}, "training_file": files["preference"]},
         400, "hyperparameters"),
        ({"method": {"type": "dpo", "supervised": {}}}, 400, "method"),
        ({"method": {"type": "rlhf"}}, 400, "method.type"),
        ({"method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 5}}}, "training_file": files["preference"]},
         400, "method.dpo.hyperparameters.beta"),
        ({"method": {"type": "dpo"}}, 400, "training_file"),  # a chat file for a DPO job
        ({"training_file": files["preference"]}, 400, "training_file"),  # and a preference file for supervised
        ({"metadata": {str(key): "v" for key in range(17)}}, 400, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, 400, "metadata"),
        ({"metadata": {"k": "v" * 513}}, 400, "metadata.k"),
        ({"metadata": {"k": 1}}, 400, "metadata.k"),
        ({"early_stopping": {"patience": 2}}, 400, "early_stopping"),  # no validation file
        ({"early_stopping": {"patience": 0}, "validation_file": files["chat"]}, 400, "early_stopping.patience"),
        ({"from_checkpoint": "ftckpt-000000000000000000000000"}, 404, "from_checkpoint"),
        ({"promote": {"alias": "latest", "when": "always"}}, 400, "promote.alias"),
        ({"promote": {"alias": "9-lives", "when": "always"}}, 400, "promote.alias"),
        ({"promote": {"alias": "prod", "when": "sometimes"}}, 400, "promote.when"),
        ({"promote": {"alias": "prod"}}, 400, "promote.when"),  # valid_loss_improves (the default) without validation
        ({"promote": {"when": "always"}}, 400, "promote.alias"),
    ]
    with server.http() as client:
        before = client.get("/v1/fine_tuning/jobs").json()["data"]
        for change, status, param in cases:
            for path in ("/v1/fine_tuning/jobs", "/v1/fine_tuning/estimate"):
                response = client.post(path, json={**good, **change})
                assert response.status_code == status, (path, change, response.text)
                assert response.json()["error"]["param"].startswith(param), (path, change, response.json())
        assert client.get("/v1/fine_tuning/jobs").json()["data"] == before  # nothing was created


def test_an_estimate_counts_the_job_s_tokens_steps_and_evaluations(server: TrainingServer, files) -> None:
    with server.http() as client:
        one = client.post("/v1/fine_tuning/estimate", json={
            "model": "base", "training_file": files["chat"], "hyperparameters": {"n_epochs": 2, "batch_size": 2}})
        assert one.status_code == 200, one.text
        estimate = one.json()
        assert estimate["object"] == "fine_tuning.estimate" and estimate["model"] == server.model_name
        assert (estimate["n_epochs"], estimate["total_steps"], estimate["evaluations"]) == (2, 4, 0)  # 2 x ceil(3/2)
        assert estimate["trained_tokens"] == 2 * estimate["training_tokens"] > 0
        assert estimate["rate_source"] == "default"  # no job has finished on this server
        assert estimate["estimated_seconds"] == pytest.approx(
            estimate["startup_seconds"] + estimate["trained_tokens"] / estimate["tokens_per_second"])

        validated = client.post("/v1/fine_tuning/estimate", json={
            "model": "base", "training_file": files["chat"], "validation_file": files["chat"],
            "hyperparameters": {"n_epochs": 2, "batch_size": 2, "eval_interval": 1}}).json()
        assert validated["evaluations"] == 4 and validated["validation_tokens"] == estimate["training_tokens"]
        assert validated["trained_tokens"] == estimate["trained_tokens"] + 4 * validated["validation_tokens"]


def test_pause_and_resume_a_queued_job_and_refuse_them_in_the_wrong_state(server: TrainingServer, files) -> None:
    with server.http() as client:
        job_id = client.post("/v1/fine_tuning/jobs", json={"model": "base", "training_file": files["chat"]}).json()["id"]
        path = f"/v1/fine_tuning/jobs/{job_id}"
        paused = client.post(f"{path}/pause")
        assert paused.status_code == 200 and paused.json()["status"] == "paused"
        assert paused.json()["finished_at"] is None
        again = client.post(f"{path}/pause")
        assert again.status_code == 409 and "only a queued or running job can be paused" in again.json()["error"]["message"]
        with server.http("globex-developer") as other:
            assert other.post(f"{path}/resume").status_code == 404
        assert client.delete(f"/v1/files/{files['chat']}").status_code == 409  # a paused job still reads it

        resumed = client.post(f"{path}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
        refused = client.post(f"{path}/resume")
        assert refused.status_code == 409
        assert "only a paused, failed or cancelled job can be resumed" in refused.json()["error"]["message"]

        assert client.post(f"{path}/cancel").json()["status"] == "cancelled"
        assert client.post(f"{path}/resume").json()["status"] == "queued"
        assert client.post(f"{path}/pause").json()["status"] == "paused"
        assert client.post(f"{path}/cancel").json()["status"] == "cancelled"  # a paused job can be cancelled
        messages = [event["message"] for event in all_events(client, job_id)]
        assert messages[1:] == ["The job was paused before it ran",
                                "The paused job was resumed; it is queued and continues from its last checkpoint",
                                "The job was cancelled before it ran",
                                "The cancelled job was resumed; it is queued and continues from its last checkpoint",
                                "The job was paused before it ran", "The paused job was cancelled"]


def test_cli_estimates_before_it_creates_and_pauses_and_resumes(server: TrainingServer, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(line) for line in product_dataset()[:4]))
    file_id = run_cli(server, "files", "upload", str(data)).stdout.strip()
    with server.http() as client:
        before = client.get("/v1/fine_tuning/jobs", params={"limit": 100}).json()["data"]
    only = run_cli(server, "jobs", "create", "--training-file", file_id, "--n-epochs", "2", "--batch-size", "2",
                   "--estimate")
    assert only.returncode == 0, only.stderr
    assert "estimate: " in only.stdout and "4 steps" in only.stdout and "default rate" in only.stdout
    with server.http() as client:
        assert client.get("/v1/fine_tuning/jobs", params={"limit": 100}).json()["data"] == before  # nothing created

    created = run_cli(server, "jobs", "create", "--training-file", file_id, "--method", "dpo", "--beta", "0.2")
    assert created.returncode == 1 and "training_file" in created.stderr  # a chat file cannot train DPO
    refused = run_cli(server, "jobs", "create", "--training-file", file_id, "--promote-when", "always")
    assert refused.returncode == 1 and "add --promote-alias ALIAS" in refused.stderr
    refused = run_cli(server, "jobs", "create", "--training-file", file_id, "--promote-alias", "prod")
    assert refused.returncode == 1 and "promote.when" in refused.stderr  # gated by default: needs a validation file
    created = run_cli(server, "jobs", "create", "--training-file", file_id, "--eval-interval", "auto",
                      "--metadata", "team=search", "--suffix", "cli-paused", "--promote-alias", "prod",
                      "--promote-when", "always")
    assert created.returncode == 0, created.stderr
    assert "estimate: " in created.stderr
    job_id = created.stdout.strip()
    paused = run_cli(server, "jobs", "pause", job_id)
    assert paused.returncode == 0 and f"{job_id}: paused" in paused.stderr
    followed = run_cli(server, "jobs", "follow", job_id)  # a paused job rests: follow returns, not as a failure
    assert followed.returncode == 0 and f"loraloom jobs resume {job_id}" in followed.stderr
    resumed = run_cli(server, "jobs", "resume", job_id)
    assert resumed.returncode == 0 and f"{job_id}: queued" in resumed.stderr
    with server.http() as client:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        assert job["metadata"] == {"team": "search"} and job["hyperparameters"]["eval_interval"] == "auto"
        assert job["promote"] == {"alias": "prod", "when": "always"}
        client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")


def test_jobs_create_help_shows_the_dpo_hyperparameters(server: TrainingServer) -> None:
    shown = run_cli(server, "jobs", "create", "--help")
    help_text = "".join(shown.stdout.split())
    assert "--beta" in help_text and "(--methoddpoonly.)" in help_text and "--estimate" in help_text
    assert f"Default:{Hyperparameters().eval_interval}." in help_text
