"""Issue 40 on real runs of the tiny base: a job's estimate is what the finished job reports (its
trained tokens, steps and evaluations), and the job's success teaches the server its training rate;
a job created from another job's checkpoint starts from that checkpoint's LoRA weights, and one whose
rank, alpha or modules do not fit the checkpoint, or that names another tenant's, is refused naming the
field."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from job_runs import JobRuns
from live_api import new_tenant
from product_codes import product_dataset
from safetensors.torch import load
from sqlalchemy import select
from training_live import training_settings

from loraloom.platform.db.models import FineTuningCheckpoint, FineTuningJobStatus
from loraloom.platform.storage import content_key
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.estimate import estimate_job
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.throughput import (DEFAULT_STARTUP_SECONDS, DEFAULT_TOKENS_PER_SECOND,
                                                     training_rate)

# 12 training examples in batches of 2 over 2 epochs: 12 steps, evaluated every 5 steps and at the end.
HYPERPARAMETERS = Hyperparameters(n_epochs=2, batch_size=2, learning_rate=1e-3, lora_r=4, lora_alpha=8,
                                  lora_dropout=0.0, max_seq_len=64, target_modules=["q_proj", "v_proj"],
                                  eval_interval=5)


@pytest.fixture
def runs(tiny_base: Path, tmp_path: Path) -> Iterator[JobRuns]:
    job_runs = JobRuns(training_settings(tmp_path / "data", training_checkpoint_every=5), tiny_base)
    yield job_runs
    job_runs.close()


def estimate(runs: JobRuns, hyperparameters: Hyperparameters, training_file: str, validation_file: str | None,
             **options):
    with runs.factory() as session:
        return estimate_job(
            session, store=runs.store, tokenizer=runs.tokenizer, tenant_id=runs.tenant_id, served=runs.served,
            model="base", training_file=training_file, validation_file=validation_file, suffix=None,
            hyperparameters=hyperparameters, method="supervised", early_stopping_patience=None,
            from_checkpoint=options.get("from_checkpoint"),
        )


def test_the_estimate_is_what_the_finished_job_reports_and_the_run_sets_the_rate(runs: JobRuns) -> None:
    lines = product_dataset()
    training_file = runs.upload(lines[:12], HYPERPARAMETERS.max_seq_len)
    validation_file = runs.upload(lines[12:16], HYPERPARAMETERS.max_seq_len)
    before = estimate(runs, HYPERPARAMETERS, training_file, validation_file)
    assert (before.total_steps, before.evaluations, before.n_epochs) == (12, 3, 2)  # steps 5, 10 and 12
    assert before.trained_tokens == 2 * before.training_tokens + 3 * before.validation_tokens
    assert not before.rate.measured and before.rate.tokens_per_second == DEFAULT_TOKENS_PER_SECOND
    assert before.estimated_seconds == pytest.approx(
        DEFAULT_STARTUP_SECONDS + before.trained_tokens / DEFAULT_TOKENS_PER_SECOND)

    job = runs.run(runs.create(HYPERPARAMETERS, training_file=training_file, validation_file=validation_file, seed=5))
    assert job.status is FineTuningJobStatus.succeeded
    assert job.trained_tokens == before.trained_tokens
    assert job.metrics["total_steps"] == before.total_steps

    after = estimate(runs, HYPERPARAMETERS, training_file, validation_file)
    with runs.factory() as session:
        rate = training_rate(session, runs.tenant_id, runs.base.name)
        # Another tenant's estimates do not move when this tenant's job ends: they would tell it when others train.
        other_tenant = new_tenant(session).id
        session.commit()
        assert training_rate(session, other_tenant, runs.base.name).measured is False
    assert (rate.measured, rate.runs) == (True, 1) and rate.tokens_per_second > 0 and rate.startup_seconds > 0
    assert after.rate == rate and after.trained_tokens == before.trained_tokens
    assert after.estimated_seconds == pytest.approx(rate.startup_seconds + after.trained_tokens / rate.tokens_per_second)


def test_a_job_from_a_checkpoint_starts_from_its_weights(runs: JobRuns, tiny_base: Path) -> None:
    training_file = runs.upload(product_dataset()[:12], HYPERPARAMETERS.max_seq_len)
    source = runs.run(runs.create(HYPERPARAMETERS, training_file=training_file, seed=5))
    assert source.status is FineTuningJobStatus.succeeded
    with runs.factory() as session:
        checkpoint = session.scalar(select(FineTuningCheckpoint).where(FineTuningCheckpoint.job_id == source.id,
                                                                       FineTuningCheckpoint.step == 10))
    with runs.store.open(content_key(checkpoint.weights_sha256)) as blob:
        start = load(blob.read())

    # So small a learning rate that the job ends next to where it started: the checkpoint's weights, not
    # a fresh LoRA's (whose B matrices are zero).
    barely = HYPERPARAMETERS.model_copy(update={"learning_rate": 1e-7, "n_epochs": 1})
    job = runs.run(runs.create(barely, training_file=training_file, seed=6, from_checkpoint=checkpoint.id))
    assert job.status is FineTuningJobStatus.succeeded and job.from_checkpoint == checkpoint.id
    assert f"Starting from the weights of checkpoint {checkpoint.id} (step 10 of job {source.id})" in runs.messages(job.id)
    published = runs.published_weights(job.id)
    assert published.keys() == start.keys()
    lora_b = [name for name in start if "lora_B" in name]
    assert lora_b and all(start[name].abs().max() > 1e-3 for name in lora_b)
    for name in start:
        torch.testing.assert_close(published[name], start[name], rtol=0, atol=1e-4)

    with pytest.raises(TrainingInputError) as refused:
        runs.create(barely.model_copy(update={"lora_r": 8}), training_file=training_file, seed=6,
                    from_checkpoint=checkpoint.id)
    assert refused.value.param == "hyperparameters.lora_r" and "has rank 4" in refused.value.message
    for change, param in (({"lora_alpha": 16.0}, "hyperparameters.lora_alpha"),
                          ({"target_modules": ["q_proj"]}, "hyperparameters.target_modules")):
        with pytest.raises(TrainingInputError) as refused:
            runs.create(barely.model_copy(update=change), training_file=training_file, seed=6,
                        from_checkpoint=checkpoint.id)
        assert refused.value.param == param

    other = JobRuns(runs.settings, tiny_base)  # another tenant of the same server
    try:
        their_file = other.upload(product_dataset()[:12], HYPERPARAMETERS.max_seq_len)
        for attempt in (lambda: other.create(barely, training_file=their_file, seed=6, from_checkpoint=checkpoint.id),
                        lambda: estimate(other, barely, their_file, None, from_checkpoint=checkpoint.id)):
            with pytest.raises(TrainingInputError) as refused:
                attempt()
            assert (refused.value.param, refused.value.code) == ("from_checkpoint", "checkpoint_not_found")
    finally:
        other.close()
