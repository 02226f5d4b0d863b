"""Issue 40 item 3 on real runs of the tiny base: a job's `promote` moves an alias of its adapter to the
job's version: `always` unconditionally; `valid_loss_improves` only when the version's validation loss is
strictly lower than that of each version the alias names, measured on the job's validation file with the
job's own loss (DPO's against the job's reference log-probabilities), and refused otherwise. Either way
the alias's history (GET .../aliases/{alias}/history) and the job's `promotion` event record both
losses; a gate that cannot measure skips the promotion and the job still succeeds; a promotion that
cannot happen is refused at create, naming the field."""
from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from job_runs import JobRuns
from live_api import bearer, make_key
from product_codes import PRODUCT_NAMES, product_codes, product_dataset, question
from sqlalchemy import select
from training_live import MAX_LORA_RANK, training_settings

from loraloom.engine import EngineFacts
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.api.engineless import NO_ENGINE_DEVICE, EnginelessClient
from loraloom.platform.cli.adapter_alias import adapters_alias
from loraloom.platform.cli.main import build_parser
from loraloom.platform.db.models import (
    AdapterVersion,
    AdapterVersionFile,
    FineTuningJob,
    FineTuningJobEvent,
    FineTuningJobStatus,
    Tenant,
)
from loraloom.platform.registry.aliases import AliasTarget, alias_target, split_alias
from loraloom.platform.registry.splits import Share
from loraloom.platform.storage import content_key
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.estimate import estimate_job
from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters
from loraloom.platform.training.promotion import Promotion

# 12 examples, 2 epochs in batches of 2: 12 steps at a rate that lowers the loss of the examples it sees.
TRAINED = Hyperparameters(n_epochs=2, batch_size=2, learning_rate=1e-2, lora_r=4, lora_alpha=8, lora_dropout=0.0,
                          max_seq_len=64, target_modules=["q_proj", "v_proj"])
# One step so small that the adapter is the base's function to many digits: a version no better than the base.
BARELY = TRAINED.model_copy(update={"learning_rate": 1e-9, "n_epochs": 1, "batch_size": 12})
GATED = Promotion("prod", "valid_loss_improves")
ALWAYS = Promotion("prod", "always")


@pytest.fixture
def runs(tiny_base: Path, tmp_path: Path) -> Iterator[JobRuns]:
    job_runs = JobRuns(training_settings(tmp_path / "data"), tiny_base)
    yield job_runs
    job_runs.close()


@pytest.fixture
def files(runs: JobRuns) -> dict[str, str]:
    lines = product_dataset()
    # The validation file holds examples the trained run learns: TRAINED lowers its loss well below BARELY's.
    return {"training_file": runs.upload(lines[:12], TRAINED.max_seq_len),
            "validation_file": runs.upload(lines[:4], TRAINED.max_seq_len)}


def run(runs: JobRuns, hyperparameters: Hyperparameters, seed: int, **options: Any) -> FineTuningJob:
    job = runs.run(runs.create(hyperparameters, seed=seed, suffix="bot", **options))
    assert job.status is FineTuningJobStatus.succeeded, (job.error_code, job.error_message)
    return job


def promotion_event(runs: JobRuns, job_id: str) -> FineTuningJobEvent:
    with runs.factory() as session:
        events = list(session.scalars(select(FineTuningJobEvent).where(
            FineTuningJobEvent.job_id == job_id, FineTuningJobEvent.type == "promotion")))
    assert len(events) == 1, [event.message for event in events]
    return events[0]


def target(runs: JobRuns) -> AliasTarget | None:
    with runs.factory() as session:
        return alias_target(session, tenant_id=runs.tenant_id, name="bot", alias="prod")


def history(runs: JobRuns, tiny_base: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[dict[str, Any]], str]:
    """GET /v1/adapters/bot/aliases/prod/history, from the control plane's app over the same database,
    and what `loraloom adapters alias show bot prod` prints of it."""
    with runs.factory() as session:
        tenant = session.get(Tenant, runs.tenant_id).name
    key = make_key(runs.settings, tenant=tenant, role="developer")
    facts = EngineFacts.of_model_dir(tiny_base, EngineConfig(max_lora_rank=MAX_LORA_RANK), device=NO_ENGINE_DEVICE)
    app = compose_app(runs.settings, EnginelessClient(facts, tiny_base))
    with TestClient(app, headers=bearer(key)) as client:
        response = client.get("/v1/adapters/bot/aliases/prod/history")
        capsys.readouterr()
        adapters_alias(client, build_parser().parse_args(["adapters", "alias", "show", "bot", "prod"]))
    assert response.status_code == 200, response.text
    return response.json()["data"], capsys.readouterr().out


def full_valid_loss(job: FineTuningJob) -> float:
    return job.metrics["full_valid_loss"]


def test_the_gate_refuses_a_worse_version_and_records_both_losses(
    runs: JobRuns, files, tiny_base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = run(runs, TRAINED, seed=1, promote=GATED, **files)
    created = promotion_event(runs, good.id).data
    assert (created["decision"], created["from_version"], created["to_version"]) == ("promoted", None, 1)
    assert created["current_valid_loss"] is None and created["new_valid_loss"] == full_valid_loss(good)

    worse = run(runs, BARELY, seed=2, promote=GATED, **files)
    assert worse.fine_tuned_model == "bot@2"  # published all the same, as bot:latest
    assert full_valid_loss(worse) > full_valid_loss(good) + 0.1
    assert target(runs) == AliasTarget(version=1, split=None)
    event = promotion_event(runs, worse.id)
    assert event.level == "info" and event.message.startswith("Kept bot:prod at version 1")
    refused = event.data
    assert (refused["decision"], refused["from_version"], refused["to_version"]) == ("refused", 1, None)
    # Version 1 measured by the gate on the job's validation file is what its own run reported.
    assert refused["current_valid_loss"] == pytest.approx(full_valid_loss(good), rel=1e-5)
    assert refused["new_valid_loss"] == full_valid_loss(worse)
    assert refused["compared"] == [{"version": 1, "valid_loss": refused["current_valid_loss"]}]

    entries, shown = history(runs, tiny_base, capsys)
    assert [(entry["action"], entry["from_version"], entry["to_version"], entry["training_job_id"])
            for entry in entries] == [("gated_promote", None, 1, good.id), ("gate_refused", 1, 1, worse.id)]
    assert (f"gate_refused  bot@1  (job {worse.id}: version 2 valid_loss {refused['new_valid_loss']:.4f} against "
            f"{refused['current_valid_loss']:.4f})") in shown
    assert entries[0]["gate"] == {"new_version": 1, "new_valid_loss": full_valid_loss(good),
                                  "current_valid_loss": None, "compared": []}
    assert entries[1]["gate"] == {"new_version": 2, "new_valid_loss": refused["new_valid_loss"],
                                  "current_valid_loss": refused["current_valid_loss"],
                                  "compared": refused["compared"]}

    # A split is compared version by version: the job's version must beat the best of them.
    with runs.factory() as session:
        split_alias(session, tenant_id=runs.tenant_id, name="bot", alias="prod", shares=[Share(1, 50), Share(2, 50)],
                    actor_key_id=None)
    third = run(runs, BARELY, seed=3, promote=GATED, **files)
    split = promotion_event(runs, third.id).data
    assert split["decision"] == "refused" and [row["version"] for row in split["compared"]] == [1, 2]
    assert split["current_valid_loss"] == min(row["valid_loss"] for row in split["compared"])
    assert split["current_valid_loss"] == pytest.approx(full_valid_loss(good), rel=1e-5)
    assert target(runs) == AliasTarget(version=1, split=(Share(1, 50), Share(2, 50)))


def test_the_gate_moves_a_better_version_and_always_moves(
    runs: JobRuns, files, tiny_base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `always` needs no validation file, and moves without measuring.
    first = run(runs, BARELY, seed=1, promote=ALWAYS, training_file=files["training_file"])
    moved = promotion_event(runs, first.id).data
    assert (moved["decision"], moved["when"], moved["to_version"]) == ("promoted", "always", 1)
    assert target(runs) == AliasTarget(version=1, split=None)

    better = run(runs, TRAINED, seed=2, promote=GATED, **files)
    event = promotion_event(runs, better.id)
    assert event.message.startswith("Promoted bot:prod from version 1 to 2")
    promoted = event.data
    assert (promoted["decision"], promoted["from_version"], promoted["to_version"]) == ("promoted", 1, 2)
    assert promoted["new_valid_loss"] == full_valid_loss(better) < promoted["current_valid_loss"] - 0.1
    assert target(runs) == AliasTarget(version=2, split=None)

    entries, shown = history(runs, tiny_base, capsys)
    assert [(entry["action"], entry["from_version"], entry["to_version"], entry["training_job_id"])
            for entry in entries] == [("job_promote", None, 1, first.id), ("gated_promote", 1, 2, better.id)]
    assert f"job_promote  bot@1  (job {first.id})" in shown
    assert entries[0]["gate"] is None
    assert entries[1]["gate"]["current_valid_loss"] == promoted["current_valid_loss"]
    assert entries[1]["gate"]["new_valid_loss"] == promoted["new_valid_loss"]


def test_a_gate_that_cannot_evaluate_skips_the_promotion_and_the_job_succeeds(runs: JobRuns, files) -> None:
    run(runs, BARELY, seed=1, promote=ALWAYS, training_file=files["training_file"])
    with runs.factory() as session:  # version 1's weights are lost from storage: the gate cannot load it
        sha256 = session.scalar(select(AdapterVersionFile.sha256).join(AdapterVersion).where(
            AdapterVersion.number == 1, AdapterVersionFile.filename == "adapter_model.safetensors"))
    runs.store.delete(content_key(sha256))

    job = run(runs, TRAINED, seed=2, promote=GATED, **files)
    assert job.fine_tuned_model == "bot@2"
    event = promotion_event(runs, job.id)
    assert event.level == "warn" and event.message.startswith("Skipped promoting bot:prod")
    assert (event.data["decision"], event.data["to_version"]) == ("skipped", None)
    assert "versions the alias names (1) could not be evaluated" in event.data["reason"]
    assert "BlobNotFoundError" in event.data["reason"]
    assert target(runs) == AliasTarget(version=1, split=None)
    assert runs.messages(job.id)[-1].startswith("The job has successfully completed")


def preference_lines(count: int) -> list[dict]:
    return [
        {"input": {"messages": question(code)},
         "preferred_output": [{"role": "assistant", "content": f"{name}."}],
         "non_preferred_output": [{"role": "assistant", "content": "I do not know that product."}]}
        for code, name in zip(product_codes(count), PRODUCT_NAMES)
    ]


def test_a_dpo_gate_measures_against_the_job_s_reference(runs: JobRuns) -> None:
    trained = DpoHyperparameters(n_epochs=4, batch_size=3, learning_rate=1e-2, lora_r=4, lora_alpha=8,
                                 lora_dropout=0.0, max_seq_len=64, beta=0.5)
    barely = trained.model_copy(update={"learning_rate": 1e-9, "n_epochs": 1, "batch_size": 6})
    lines = preference_lines(6)
    files = {"training_file": runs.upload(lines, 64), "validation_file": runs.upload(lines[:3], 64)}
    good = run(runs, trained, seed=1, method="dpo", promote=GATED, **files)
    assert full_valid_loss(good) < math.log(2) - 0.05  # the preferred answers gained on the reference
    worse = run(runs, barely, seed=2, method="dpo", promote=GATED, **files)
    refused = promotion_event(runs, worse.id).data
    assert refused["decision"] == "refused"
    # Both jobs start from the base, so their references agree: version 1's DPO loss against the second job's
    # reference is version 1's own full_valid_loss. (Measured without a reference it would be log 2.)
    assert refused["current_valid_loss"] == pytest.approx(full_valid_loss(good), rel=1e-4)
    assert refused["new_valid_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert target(runs) == AliasTarget(version=1, split=None)


def test_a_promotion_that_cannot_happen_is_refused_at_create_naming_the_field(runs: JobRuns, files) -> None:
    cases = [
        (Promotion("latest", "always"), files, "promote.alias", "moves by itself"),
        (Promotion("9-lives", "always"), files, "promote.alias", "not a valid alias name"),
        (Promotion("prod", "sometimes"), files, "promote.when", "valid_loss_improves, always"),
        (GATED, {"training_file": files["training_file"]}, "promote.when", "no validation_file"),
    ]
    for promotion, job_files, param, problem in cases:
        with pytest.raises(TrainingInputError) as created:
            runs.create(TRAINED, seed=1, promote=promotion, **job_files)
        with runs.factory() as session, pytest.raises(TrainingInputError) as estimated:
            estimate_job(session, store=runs.store, tokenizer=runs.tokenizer, tenant_id=runs.tenant_id,
                         served=runs.served, model="base", suffix=None, hyperparameters=TRAINED, method="supervised",
                         early_stopping_patience=None, from_checkpoint=None, promote=promotion,
                         **{"validation_file": None, **job_files})
        for refused in (created.value, estimated.value):
            assert (refused.param, refused.code) == (param, "invalid_promote"), refused.message
            assert refused.message.startswith(f"{param}: ") and problem in refused.message
    with runs.factory() as session:
        assert session.scalars(select(FineTuningJob).where(FineTuningJob.tenant_id == runs.tenant_id)).all() == []
    job = runs.job(runs.create(TRAINED, seed=1, promote=GATED, **files))
    assert (job.promote_alias, job.promote_when) == ("prod", "valid_loss_improves")
