"""Issue 40's pause and resume on real runs of the tiny base: a job paused while it trains ends
`paused` with a checkpoint of the steps it did; resumed, it continues from there and publishes the
very adapter an uninterrupted job with the same seed publishes. A cancelled job resumed finishes too."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from job_runs import JobRuns, on_step
from product_codes import product_dataset
from training_live import training_settings

from loraloom.platform.db.models import FineTuningJobStatus
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import cancel_job
from loraloom.platform.training.lifecycle import pause_job, resume_job

# 12 examples in batches of 2 over 2 epochs: 12 steps. Checkpoints every 5 steps, so the pause at step 3
# saves one of its own and the resumed run passes a scheduled one (step 5, 10) before it ends.
HYPERPARAMETERS = Hyperparameters(n_epochs=2, batch_size=2, learning_rate=1e-3, lora_r=4, lora_alpha=8,
                                  lora_dropout=0.1, max_seq_len=64, target_modules=["q_proj", "v_proj"])
SEED = 11
PAUSED_AT = 3


@pytest.fixture
def runs(tiny_base: Path, tmp_path: Path) -> Iterator[JobRuns]:
    job_runs = JobRuns(training_settings(tmp_path / "data", training_checkpoint_every=5), tiny_base)
    yield job_runs
    job_runs.close()


def request(runs: JobRuns, change, job_id: str, **arguments) -> None:
    with runs.factory() as session:
        change(session, tenant_id=runs.tenant_id, job_id=job_id, **arguments)


def test_a_paused_then_resumed_job_publishes_the_uninterrupted_job_s_adapter(runs: JobRuns) -> None:
    training_file = runs.upload(product_dataset()[:12], HYPERPARAMETERS.max_seq_len)
    uninterrupted = runs.create(HYPERPARAMETERS, training_file=training_file, seed=SEED)
    assert runs.run(uninterrupted).status is FineTuningJobStatus.succeeded

    paused = runs.create(HYPERPARAMETERS, training_file=training_file, seed=SEED)
    with on_step(paused, PAUSED_AT, lambda: request(runs, pause_job, paused)) as hook:
        job = runs.run(paused)
    assert hook.fired
    assert (job.status, job.finished_at, job.run_token, job.metrics["step"]) == (
        FineTuningJobStatus.paused, None, None, PAUSED_AT)
    messages = runs.messages(paused)
    assert "Pause requested; the job stops after its current step and saves a checkpoint" in messages
    assert f"The job was paused after step {PAUSED_AT} of 12; resume it with POST /v1/fine_tuning/jobs/{paused}/resume" \
        in messages
    assert any(message.startswith("Checkpoint ftckpt-") and message.endswith(f"at step {PAUSED_AT}")
               for message in messages)

    request(runs, resume_job, paused, max_attempts=runs.settings.training_max_attempts, send=runs.sent.append)
    assert runs.job(paused).status is FineTuningJobStatus.queued and runs.sent[-1] == paused
    job = runs.run(paused)
    assert (job.status, job.attempts) == (FineTuningJobStatus.succeeded, 2)
    assert "Resuming from checkpoint" in " ".join(runs.messages(paused))
    assert job.trained_tokens == runs.job(uninterrupted).trained_tokens

    expected, resumed = runs.published_weights(uninterrupted), runs.published_weights(paused)
    assert resumed.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=1e-6)


def test_a_cancelled_job_resumed_finishes(runs: JobRuns) -> None:
    training_file = runs.upload(product_dataset()[:12], HYPERPARAMETERS.max_seq_len)
    job_id = runs.create(HYPERPARAMETERS, training_file=training_file, seed=SEED)
    with on_step(job_id, PAUSED_AT, lambda: request(runs, cancel_job, job_id)):
        job = runs.run(job_id)
    assert job.status is FineTuningJobStatus.cancelled and job.finished_at is not None

    request(runs, resume_job, job_id, max_attempts=1, send=runs.sent.append)
    job = runs.job(job_id)
    assert (job.status, job.finished_at, job.max_attempts) == (FineTuningJobStatus.queued, None, 2)
    job = runs.run(job_id)
    assert job.status is FineTuningJobStatus.succeeded and job.fine_tuned_model is not None
    assert any(message.startswith("The cancelled job was resumed") for message in runs.messages(job_id))
