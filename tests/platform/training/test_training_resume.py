"""Issue 12, item 7: a job whose worker died could never be retried once it had a checkpoint: the
retry restarted at step 1, inserted a (job_id, step) checkpoint row that existed, and the job ended
system_error with raw SQL in its message. Here the process running a job is SIGKILLed after its
first checkpoint; the reaper requeues the job and the retry resumes from the last checkpoint: it
succeeds, its steps continue after the checkpoint, no checkpoint step is recorded twice, and the
published weights are those of a run that was never interrupted."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import torch
from product_codes import product_dataset
from safetensors.torch import load
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from training_live import MAX_LORA_RANK, training_settings, wait_for, worker_environment

from live_api import new_tenant
from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import (
    AdapterVersionFile,
    FineTuningCheckpoint,
    FineTuningJob,
    FineTuningJobEvent,
    FineTuningJobStatus,
)
from loraloom.platform.storage import content_key, storage_from_settings
from loraloom.platform.training.datasets import load_dataset
from loraloom.platform.training.files import FINE_TUNE_PURPOSE, create_file
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.job_state import reap_stale_jobs
from loraloom.platform.training.jobs import ServedModel, create_job
from loraloom.platform.training.runner import WorkerContext, run_job, shown_system_error
from loraloom.platform.training.trainer import train_lora

# 30 examples in batches of 2 over 12 epochs: 180 steps of the tiny base, a checkpoint every 5.
# Long enough that the first run is still training when the test sees its first checkpoint.
HYPERPARAMETERS = Hyperparameters(n_epochs=12, batch_size=2, learning_rate=1e-3, lora_r=4, lora_alpha=8,
                                  lora_dropout=0.1, max_seq_len=64, target_modules=["q_proj", "v_proj"])
TOTAL_STEPS = 180
CHECKPOINT_EVERY = 5
SEED = 3
TIMEOUT_S = 300  # generous bounds for 2 shared, busy cores
RUN_ONE_JOB = Path(__file__).with_name("run_one_job.py")


def dataset_bytes() -> bytes:
    return "\n".join(json.dumps(line) for line in product_dataset()).encode()


def add_job(settings, tiny_base: Path) -> str:
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            tenant = new_tenant(session)
            file = create_file(
                session, store=storage_from_settings(settings), tenant_id=tenant.id, actor_key_id=None,
                filename="train.jsonl", purpose=FINE_TUNE_PURPOSE, stream=io.BytesIO(dataset_bytes()),
                max_bytes=settings.training_file_max_bytes, tokenizer=Tokenizer.from_dir(tiny_base),
                max_seq_len=HYPERPARAMETERS.max_seq_len,
            )
            job = create_job(
                session, tenant_id=tenant.id, actor_key_id=None,
                served=ServedModel(name=tiny_base.name, max_lora_rank=MAX_LORA_RANK, reserved_names=frozenset()),
                model=tiny_base.name, training_file=file.id, validation_file=None, suffix="resumed", seed=SEED,
                hyperparameters=HYPERPARAMETERS, max_attempts=settings.training_max_attempts, send=lambda _: None,
            )
            return job.id
    finally:
        engine.dispose()


def query(settings, statement):
    engine = create_db_engine(settings.database_url)
    try:
        with create_session_factory(engine)() as session:
            return session.scalars(statement).all()
    finally:
        engine.dispose()


def uninterrupted_weights(tiny_base: Path, out: Path) -> dict[str, torch.Tensor]:
    examples = load_dataset(dataset_bytes(), Tokenizer.from_dir(tiny_base), HYPERPARAMETERS.max_seq_len,
                            param="training_file")[1]
    result = train_lora(
        base_model_dir=tiny_base, train_examples=examples, eval_examples=[], hyperparameters=HYPERPARAMETERS,
        seed=SEED, output_dir=out, on_metrics=lambda _: None, should_cancel=lambda: False,
        save_checkpoint=lambda step, directory: None, checkpoint_every=CHECKPOINT_EVERY,
    )
    return load((result.adapter_dir / "adapter_model.safetensors").read_bytes())


def test_a_job_whose_worker_was_killed_resumes_from_its_last_checkpoint(tiny_base: Path, tmp_path: Path) -> None:
    settings = training_settings(tmp_path / "data", training_checkpoint_every=CHECKPOINT_EVERY,
                                 training_max_attempts=3)
    job_id = add_job(settings, tiny_base)
    with open(tmp_path / "doomed.log", "wb") as log:
        doomed = subprocess.Popen([sys.executable, str(RUN_ONE_JOB), job_id, str(tiny_base)],
                                  env=worker_environment(settings), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: query(settings, select(FineTuningCheckpoint.step).where(FineTuningCheckpoint.job_id == job_id)),
                 "the first run's first checkpoint", TIMEOUT_S, tmp_path / "doomed.log", poll_s=0.05)
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
    (job,) = query(settings, select(FineTuningJob).where(FineTuningJob.id == job_id))
    assert job.status is FineTuningJobStatus.running, "the first run ended before it was killed: train longer"

    # The reaper (in serve, or in any worker) finds the heartbeat stale and requeues the job.
    factory = create_session_factory(create_db_engine(settings.database_url))
    sent: list[str] = []
    wait_for(lambda: reap_stale_jobs(factory, heartbeat_timeout_s=settings.training_heartbeat_timeout_s,
                                     send=sent.append), "the reaper to requeue the job", TIMEOUT_S)
    assert sent == [job_id]
    resumed_from = max(query(settings, select(FineTuningCheckpoint.step).where(FineTuningCheckpoint.job_id == job_id)))

    run_job(job_id, WorkerContext(settings=settings, model_dir=tiny_base, max_lora_rank=MAX_LORA_RANK,
                                  worker_id="retry-worker", send=sent.append))

    (job,) = query(settings, select(FineTuningJob).where(FineTuningJob.id == job_id))
    assert (job.status, job.attempts, job.error_message) == (FineTuningJobStatus.succeeded, 2, None)
    steps = query(settings, select(FineTuningCheckpoint.step).where(FineTuningCheckpoint.job_id == job_id)
                  .order_by(FineTuningCheckpoint.step))
    assert steps == list(range(CHECKPOINT_EVERY, TOTAL_STEPS + 1, CHECKPOINT_EVERY))  # each step once
    events = query(settings, select(FineTuningJobEvent).where(FineTuningJobEvent.job_id == job_id)
                   .order_by(FineTuningJobEvent.id))
    retried = [event.data["step"] for event in events if event.type == "metrics" and event.data["attempt"] == 2]
    assert retried == list(range(resumed_from + 1, TOTAL_STEPS + 1))
    assert any(event.message.startswith("Resuming from checkpoint") for event in events)

    weights_sha256 = query(settings, select(AdapterVersionFile.sha256).where(
        AdapterVersionFile.version_id == job.result_version_id, AdapterVersionFile.filename == "adapter_model.safetensors"))
    with storage_from_settings(settings).open(content_key(weights_sha256[0])) as blob:
        published = load(blob.read())
    expected = uninterrupted_weights(tiny_base, tmp_path / "uninterrupted")
    assert published.keys() == expected.keys()
    for name in expected:  # the first run and the retry ran in different processes: allow rounding
        torch.testing.assert_close(published[name], expected[name], rtol=1e-5, atol=1e-7)


def test_a_database_error_is_never_shown_to_the_user_as_sql() -> None:
    error = IntegrityError("INSERT INTO fine_tuning_checkpoints (id, job_id, step) VALUES (?, ?, ?)",
                           ("ftckpt-1", "ftjob-1", 100), Exception("UNIQUE constraint failed"))
    shown = shown_system_error(error)
    assert "INSERT" not in shown and "fine_tuning_checkpoints" not in shown and "UNIQUE" not in shown
    assert "database" in shown
    leaked_path = shown_system_error(FileNotFoundError(2, "No such file", "/srv/loraloom/blobs/sha256/ab/x"))
    assert "/srv" not in leaked_path
    assert shown_system_error(RuntimeError("this worker trains on 'a'")) == "RuntimeError: this worker trains on 'a'"
