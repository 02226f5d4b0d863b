"""Fine-tuning end to end through the public API, on the bundled model, with a real worker process
on the embedded broker (what `make run` uses):

- upload the product-code dataset, create a job: it succeeds with a falling loss in its
  events, registers products@1 (source training, lineage to the job), and chatting with it
  gives the trained names greedily where the base gives none; a checkpoint serves too;
- cancel a running job: it ends cancelled with a checkpoint, and nothing is registered.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from product_codes import (
    HYPERPARAMETERS,
    LEARNED_NAMES,
    MIN_CORRECT_FRACTION,
    PRODUCT_NAMES,
    product_codes,
    product_dataset,
    question,
)
from training_live import (
    TrainingServer,
    all_events,
    training_server,
    training_settings,
    upload,
    wait_finished,
    wait_for,
    worker_process,
)

STEPS_PER_EPOCH = len(LEARNED_NAMES) // HYPERPARAMETERS.batch_size
CHECKPOINT_EVERY = 4 * STEPS_PER_EPOCH  # two checkpoints over the 8 epochs
JOB_TIMEOUT_S = 1800  # an upper bound for 2 shared, busy cores; the job takes a few minutes on idle ones


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingServer]:
    settings = training_settings(tmp_path_factory.mktemp("fine-tuning"), training_checkpoint_every=CHECKPOINT_EVERY)
    with training_server(model_dir, settings) as live:
        yield live


@pytest.fixture(scope="module")
def worker_log(server: TrainingServer, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with worker_process(server.settings, model_dir, log):
        yield log


def greedy_answers(client: httpx.Client, model: str, codes: list[str]) -> list[str]:
    def ask(code: str) -> str:
        response = client.post("/v1/chat/completions", json={
            "model": model, "messages": question(code), "temperature": 0, "max_tokens": 12,
        })
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=len(codes)) as pool:  # one engine batch, not 30 sequential requests
        return list(pool.map(ask, codes))


def test_a_job_trains_an_adapter_that_answers_what_the_base_cannot(
    server: TrainingServer, worker_log: Path
) -> None:
    with server.http() as client:
        dataset = upload(client, product_dataset(LEARNED_NAMES))
        assert (dataset["line_count"], dataset["format"], dataset["purpose"]) == (len(LEARNED_NAMES), "chat", "fine-tune")
        assert dataset["token_count"] > len(LEARNED_NAMES) * 10
        created = client.post("/v1/fine_tuning/jobs", json={
            "model": server.model_name, "training_file": dataset["id"], "validation_file": dataset["id"],
            "suffix": "products", "seed": 0, "hyperparameters": HYPERPARAMETERS.model_dump(),
        })
        assert created.status_code == 200, created.text
        assert created.json()["status"] == "queued" and created.json()["object"] == "fine_tuning.job"
        job_id = created.json()["id"]

        final = wait_finished(client, job_id, JOB_TIMEOUT_S, worker_log)
        assert final["status"] == "succeeded", final
        assert final["fine_tuned_model"] == "products@1" and final["error"] is None
        assert final["trained_tokens"] > 0 and final["attempts"] == 1
        assert final["metrics"]["step"] == 8 * STEPS_PER_EPOCH

        events = all_events(client, job_id)
        losses = [event["data"]["train_loss"] for event in events if event["type"] == "metrics"]
        assert len(losses) == 8 * STEPS_PER_EPOCH
        first_epoch = statistics.mean(losses[:STEPS_PER_EPOCH])
        last_epoch = statistics.mean(losses[-STEPS_PER_EPOCH:])
        assert last_epoch < first_epoch / 4, (first_epoch, last_epoch)
        assert "successfully completed" in events[-1]["message"]

        checkpoints = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]
        assert [c["step_number"] for c in checkpoints] == [2 * CHECKPOINT_EVERY, CHECKPOINT_EVERY]  # newest first
        assert checkpoints[0]["metrics"]["eval_loss"] < checkpoints[1]["metrics"]["eval_loss"]

        version = client.get("/v1/adapters/products/versions/1").json()
        assert (version["source"], version["training_job_id"], version["aliases"]) == ("training", job_id, ["latest"])

        codes = product_codes(len(LEARNED_NAMES))
        tuned = greedy_answers(client, "products", codes)
        correct = sum(name in answer for name, answer in zip(LEARNED_NAMES, tuned))
        assert correct >= MIN_CORRECT_FRACTION * len(LEARNED_NAMES), list(zip(LEARNED_NAMES, tuned))
        base = greedy_answers(client, server.model_name, codes)
        assert not any(name in answer for answer in base for name in PRODUCT_NAMES), base
        # A checkpoint is an adapter reference too: the last one (the final weights) answers the same way.
        from_checkpoint = greedy_answers(client, checkpoints[0]["fine_tuned_model_checkpoint"], codes[:3])
        assert from_checkpoint == tuned[:3]


def test_a_cancelled_job_ends_with_a_checkpoint_and_registers_nothing(
    server: TrainingServer, worker_log: Path
) -> None:
    with server.http() as client:
        dataset = upload(client, product_dataset())
        long_run = HYPERPARAMETERS.model_copy(update={"n_epochs": 50})
        created = client.post("/v1/fine_tuning/jobs", json={
            "model": server.model_name, "training_file": dataset["id"], "suffix": "never-registered",
            "hyperparameters": long_run.model_dump(),
        }).json()
        job_id = created["id"]
        wait_for(lambda: any(e["type"] == "metrics" for e in all_events(client, job_id)),
                 "the job's first step", JOB_TIMEOUT_S, worker_log)

        cancelling = client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")
        assert cancelling.status_code == 200 and cancelling.json()["status"] == "cancel_requested"
        final = wait_finished(client, job_id, JOB_TIMEOUT_S, worker_log)
        assert final["status"] == "cancelled" and final["fine_tuned_model"] is None, final

        checkpoints = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]
        assert len(checkpoints) == 1 and 1 <= checkpoints[0]["step_number"] < 50 * STEPS_PER_EPOCH
        assert client.get("/v1/adapters/never-registered").status_code == 404
        again = client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel")
        assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
