"""How good is a fine-tuning job's estimate? POST /v1/fine_tuning/estimate's `estimated_seconds` against
the time the job then takes, in process (the job API's and a worker's own functions, no HTTP), on the
bundled model or --model:

1. a calibration job runs, so that the server has a measured rate for the model (the first estimate of
   a model uses a default rate and says so);
2. a second job, --scale times the calibration's examples, is estimated, then run; its estimate's
   trained_tokens must be the job's exactly, and its estimated_seconds within 25% of the job's running
   time (started_at to finished_at: loading, training, evaluations, checkpoints and publishing).

    python benchmarks/training_estimate.py [--model DIR] [--examples 16] [--scale 3] [--n-epochs 2]

Not a test (its times depend on the machine and its load): figures go to BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

from loraloom.engine import EngineConfig, Tokenizer
from loraloom.platform.db import create_db_engine, create_session_factory, upgrade_database
from loraloom.platform.db.models import FineTuningJob, Tenant
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.estimate import estimate_job
from loraloom.platform.training.files import FINE_TUNE_PURPOSE, create_file
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import ServedModel, create_job
from loraloom.platform.training.runner import WorkerContext, run_job

TOLERANCE = 0.25


def chat_lines(count: int, offset: int) -> list[dict]:
    """Conversations of varied length, so batches pad as real data does."""
    return [{"messages": [
        {"role": "user", "content": f"Describe item {n} in a sentence."},
        {"role": "assistant", "content": f"Item {n} is " + ", ".join(["useful"] * (1 + n % 7)) + "."},
    ]} for n in range(offset, offset + count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="the base (default: the bundled model)")
    parser.add_argument("--examples", type=int, default=16, help="the calibration job's training examples")
    parser.add_argument("--scale", type=int, default=3, help="the measured job's examples, as a multiple")
    parser.add_argument("--n-epochs", type=int, default=2)
    args = parser.parse_args()
    if args.model is None:
        from loraloom.engine.model.bundled import import_bundled

        args.model = import_bundled()
    hyperparameters = Hyperparameters(n_epochs=args.n_epochs, batch_size=4, lora_r=8, max_seq_len=128)
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(data_dir=Path(data_dir))
        upgrade_database(settings.database_url)
        factory = create_session_factory(create_db_engine(settings.database_url))
        store, tokenizer = storage_from_settings(settings), Tokenizer.from_dir(args.model)
        served = ServedModel(name=args.model.name, max_lora_rank=EngineConfig().max_lora_rank,
                             reserved_names=frozenset())
        with factory() as session:
            tenant = Tenant(name="estimate-bench")
            session.add(tenant)
            session.commit()

        def upload(lines: list[dict]) -> str:
            data = "\n".join(json.dumps(line) for line in lines).encode()
            with factory() as session:
                return create_file(session, store=store, tenant_id=tenant.id, actor_key_id=None, filename="d.jsonl",
                                   purpose=FINE_TUNE_PURPOSE, stream=io.BytesIO(data), max_bytes=1 << 30,
                                   tokenizer=tokenizer, max_seq_len=hyperparameters.max_seq_len).id

        def estimate_and_run(training_file: str, validation_file: str) -> tuple[object, FineTuningJob]:
            with factory() as session:
                estimate = estimate_job(
                    session, store=store, tokenizer=tokenizer, tenant_id=tenant.id, served=served, model="base",
                    training_file=training_file, validation_file=validation_file, suffix=None,
                    hyperparameters=hyperparameters, method="supervised", early_stopping_patience=None,
                    from_checkpoint=None)
                job = create_job(session, tenant_id=tenant.id, actor_key_id=None, served=served, model="base",
                                 training_file=training_file, validation_file=validation_file, suffix=None, seed=1,
                                 hyperparameters=hyperparameters, max_attempts=1, send=lambda _: None)
            run_job(job.id, WorkerContext(settings=settings, model_dir=args.model, max_lora_rank=served.max_lora_rank,
                                          worker_id="bench", send=lambda _: None))
            with factory() as session:
                return estimate, session.get(FineTuningJob, job.id)

        validation = upload(chat_lines(4, 10_000))
        rows = []
        for name, count in (("calibration", args.examples), ("measured", args.examples * args.scale)):
            started = time.monotonic()
            estimate, job = estimate_and_run(upload(chat_lines(count, 0)), validation)
            if job.trained_tokens is None:
                raise SystemExit(f"{name} job {job.status.value}: {job.error_message}")
            running_s = (job.finished_at - job.started_at).total_seconds()
            rows.append((name, count, estimate, job, running_s, time.monotonic() - started))

    print(f"model {args.model.name}, {args.n_epochs} epoch(s), batch 4, rank 8")
    print(f"{'job':<12} {'examples':>8} {'est. tokens':>11} {'tokens':>8} {'rate':>8} {'est. s':>8} "
          f"{'running s':>9} {'ratio':>6}")
    for name, count, estimate, job, running_s, _ in rows:
        source = "measured" if estimate.rate.measured else "default"
        print(f"{name:<12} {count:>8} {estimate.trained_tokens:>11} {job.trained_tokens:>8} {source:>8} "
              f"{estimate.estimated_seconds:>8.1f} {running_s:>9.1f} {estimate.estimated_seconds / running_s:>6.2f}")
    _, _, estimate, job, running_s, _ = rows[-1]
    exact = estimate.trained_tokens == job.trained_tokens
    close = abs(estimate.estimated_seconds - running_s) <= TOLERANCE * running_s
    print(f"trained_tokens exact: {exact}; estimated_seconds within {TOLERANCE:.0%} of the running time: {close}")


if __name__ == "__main__":
    main()
