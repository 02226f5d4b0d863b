"""What a worker does with one job id: claim it, train with a heartbeat, publish or fail it.

Runs in the worker's child process (a fresh one per job), where torch may be imported.
Failures are told apart for the user: TrainingInputError is their input's fault (the job
fails with its code and param; retrying cannot help), the time limit is its own code, and
anything else is a system fault, retried on another run while attempts remain. A retry
resumes from the job's last checkpoint (weights, optimizer, schedule, RNG, data position), as
does the run of a resumed job. A run asked to stop (cancel or pause) ends after its current
step with a checkpoint, the job `cancelled` or `paused`. A job with `promote` moves its alias between
publishing its version and succeeding (promotion_gate.py; an evaluation gate measures the alias's versions
before publishing), so a succeeded job's promotion is decided; it never fails the job. A run that trained
the whole job and succeeded adds its throughput to the model's measured rate (throughput.py), which
estimates use.
What a system fault's message tells the user never includes SQL or server paths: those go
to the worker's log.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, file_sha256
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import AdapterVersionSource, FineTuningJob, FineTuningJobStatus
from loraloom.platform.registry.blobs import claimed_blobs
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.dispatch import next_job
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.hyperparameters import check_rank_is_served
from loraloom.platform.training.job_state import (
    SYSTEM_ERROR,
    Claim,
    LostOwnershipError,
    beat,
    cancel_requested,
    claim_next_job,
    finish_job,
    record_checkpoint,
    record_step,
    requeue_or_fail,
    set_checkpoint_metrics,
    stop_request,
)
from loraloom.platform.training.promotion import VALID_LOSS_IMPROVES
from loraloom.platform.training.promotion_gate import GateReading, JobPromotion, promote, read_gate
from loraloom.platform.training.run_inputs import (
    fetch_resume_point,
    fetch_start_checkpoint,
    job_event,
    load_spec,
    read_file,
)
from loraloom.platform.training.throughput import record_run

logger = logging.getLogger(__name__)
TIME_LIMIT_EXCEEDED = "time_limit_exceeded"


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    model_dir: Path  # the base this worker trains on: the one the engine serves
    max_lora_rank: int  # the largest rank the engine serves (its --max-lora-rank): what an adapter must fit
    worker_id: str
    send: Callable[[str], None]  # queue a job id again


class Heartbeat:
    """Writes the run's heartbeat every `interval_s` from a thread, for as long as the block runs."""

    def __init__(self, factory: sessionmaker[Session], claim: Claim, interval_s: float) -> None:
        self.factory, self.claim, self.interval_s = factory, claim, interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.job_id}", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            try:
                if not beat(self.factory, self.claim):
                    return  # the job was taken away; the training loop notices at its next step
            except Exception:  # a database hiccup: the next beat may succeed before the job looks stale
                logger.exception("heartbeat of job %s failed", self.claim.job_id, extra={"job_id": self.claim.job_id})

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join()


def run_job(job_id: str, context: WorkerContext) -> None:
    db_engine = create_db_engine(context.settings.database_url)
    factory = create_session_factory(db_engine)
    try:
        # The message names a job, but the worker runs the one whose turn it is (dispatch.py).
        claim = claim_next_job(factory, context.worker_id)
        if claim is None:
            # Nothing may run now: the jobs are running elsewhere or over (a redelivered or duplicate
            # message), or wait on their tenant's limit (a run of theirs ending sends a message again).
            logger.info("no queued job may run now; nothing to do for the message of job %s", job_id,
                        extra={"job_id": job_id})
            return
        if claim.job_id != job_id:
            logger.info("job %s runs before job %s: its turn came first", claim.job_id, job_id,
                        extra={"job_id": claim.job_id})
        with Heartbeat(factory, claim, context.settings.training_heartbeat_interval_s):
            _run_claimed(factory, claim, context)
        _send_next(factory, claim, context)
    finally:
        db_engine.dispose()


def _send_next(factory: sessionmaker[Session], claim: Claim, context: WorkerContext) -> None:
    """A run ended and freed its tenant's slot: ask for the next job, which may be one its tenant's
    limit held back and whose message was spent on a turn that found nothing to run. A job that was
    requeued instead has had its message sent again already (requeue_or_fail)."""
    with factory() as session:
        job = session.get(FineTuningJob, claim.job_id)
        if job is not None and job.status is FineTuningJobStatus.queued:
            return
        job_id = next_job(session)
    if job_id is not None:
        context.send(job_id)


def _run_claimed(factory: sessionmaker[Session], claim: Claim, context: WorkerContext) -> None:
    try:
        _train_and_publish(factory, claim, context)
    except LostOwnershipError:
        logger.warning("job %s was requeued while this run was alive; stopping without writing", claim.job_id,
                       extra={"job_id": claim.job_id})
    except TrainingInputError as error:
        _fail(factory, claim, (error.code, error.message, error.param))
    except SoftTimeLimitExceeded:
        limit = context.settings.training_time_limit_s
        _fail(factory, claim, (TIME_LIMIT_EXCEEDED, f"The job ran longer than the time limit of {limit} s "
                                                    "(LORALOOM_TRAINING_TIME_LIMIT_S); train fewer epochs", None))
    except Exception as error:
        logger.exception("job %s: system error", claim.job_id, extra={"job_id": claim.job_id})
        with factory() as session:
            job = session.get(FineTuningJob, claim.job_id)
            if job is not None and job.run_token == claim.run_token:
                requeue_or_fail(session, job, send=context.send, error_code=SYSTEM_ERROR,
                                expected_token=claim.run_token,
                                reason=f"System error on worker {claim.worker_id}: {shown_system_error(error)}")


def shown_system_error(error: Exception) -> str:
    """What the job's user is told of a system fault. Database and file system errors carry SQL,
    table names and server paths, which are the operator's business: the log has them."""
    if isinstance(error, SQLAlchemyError):
        return "a database error (the worker's log has the details)"
    if isinstance(error, OSError):
        return "a storage or file system error (the worker's log has the details)"
    return f"{type(error).__name__}: {error}"


def _fail(factory: sessionmaker[Session], claim: Claim, error: tuple[str, str, str | None]) -> None:
    with factory() as session:
        if finish_job(session, claim, FineTuningJobStatus.failed, message=f"The job failed: {error[1]}",
                      level="error", error=error):
            session.commit()


def _train_and_publish(factory: sessionmaker[Session], claim: Claim, context: WorkerContext) -> None:
    # Imported here: torch, transformers and peft load only in the worker's child process.
    from loraloom.engine import ModelConfig, Tokenizer
    from loraloom.platform.registry.publish import publish_adapter_dir
    from loraloom.platform.registry.validation import ServedBase
    from loraloom.platform.training.datasets import load_dataset
    from loraloom.platform.training.resume import TRAINING_STATE_FILE
    from loraloom.platform.training.trainer import TrainingMetrics, TrainStatus, train_lora

    settings, model_dir = context.settings, context.model_dir
    spec = load_spec(factory, claim)
    if spec.model != model_dir.name:
        raise RuntimeError(f"this worker trains on {model_dir.name!r}, but the job is for {spec.model!r}; "
                           "start the worker with --model pointing at the served base")
    check_rank_is_served(spec.hyperparameters, context.max_lora_rank)  # before any training it would waste
    store = storage_from_settings(settings)
    tokenizer = Tokenizer.from_dir(model_dir)
    hyperparameters = spec.hyperparameters

    def examples(file_id: str | None, param: str):
        if file_id is None:
            return []
        data = read_file(factory, store, spec, file_id, param)
        return load_dataset(data, tokenizer, hyperparameters.max_seq_len, param=param, method=spec.method)[1]

    train_examples = examples(spec.training_file, "training_file")
    eval_examples = examples(spec.validation_file, "validation_file")
    job_event(factory, claim, f"Training on {len(train_examples)} examples for {hyperparameters.n_epochs} epoch(s)"
                              f"{f', evaluating on {len(eval_examples)}' if eval_examples else ''}")
    last_metrics: dict[str, Any] = {}

    # Step -> the checkpoint saved at it, whose metrics the trainer reports right after.
    checkpoints_awaiting_metrics: dict[int, str] = {}

    def on_metrics(metrics: TrainingMetrics) -> None:
        last_metrics.clear()
        last_metrics.update({key: value for key, value in asdict(metrics).items() if value is not None})
        last_metrics["attempt"] = claim.attempt  # which run wrote it: runs of one job never interleave
        if (checkpoint_id := checkpoints_awaiting_metrics.pop(metrics.step, None)) is not None:
            set_checkpoint_metrics(factory, checkpoint_id, dict(last_metrics))
        evaluated = f", validation loss={metrics.eval_loss:.4f}" if metrics.eval_loss is not None else ""
        record_step(factory, claim, f"Step {metrics.step}/{metrics.total_steps}: training loss={metrics.train_loss:.4f}"
                                    f"{evaluated}", dict(last_metrics))

    def save_checkpoint(step: int, directory: Path) -> None:
        state_file = directory / TRAINING_STATE_FILE  # absent from the final adapter saved on a late cancel
        files = [directory / ADAPTER_CONFIG_FILE, directory / ADAPTER_WEIGHTS_FILE]
        files += [state_file] if state_file.is_file() else []
        # On cancel the checkpoint holds the last reported step; on schedule, the step reported next.
        reported = last_metrics.get("step") == step
        # Claimed until the checkpoint row holds them: a version deleted meanwhile that shares
        # these bytes (the same adapter pushed earlier) must not take them from the checkpoint.
        with factory() as session, claimed_blobs(session, store, (file_sha256(path) for path in files)):
            config_ref, weights_ref, *state_refs = [store.put_file(path) for path in files]
            checkpoint_id = record_checkpoint(
                factory, claim, step=step, metrics=dict(last_metrics) if reported else {"step": step},
                config_sha256=config_ref.sha256, weights_sha256=weights_ref.sha256,
                weights_size_bytes=weights_ref.size,
                training_state_sha256=state_refs[0].sha256 if state_refs else None,
            )
        if checkpoint_id is None:
            raise LostOwnershipError(claim.job_id)
        if not reported:
            checkpoints_awaiting_metrics[step] = checkpoint_id

    work_dir = settings.training_work_dir / claim.job_id / f"attempt-{claim.attempt}"
    resume = fetch_resume_point(factory, store, claim, work_dir)
    if resume is not None:
        last_metrics.update(resume[0].metrics)
    # A resumed run's weights come from its own checkpoint; only a run from step 1 starts from another job's.
    start_from = None
    if spec.from_checkpoint is not None and resume is None:
        start_from = fetch_start_checkpoint(factory, store, claim, spec, work_dir)
    started = time.monotonic()
    result = train_lora(
        base_model_dir=model_dir,
        train_examples=train_examples,
        eval_examples=eval_examples,
        hyperparameters=hyperparameters,
        seed=spec.seed,
        output_dir=work_dir,
        on_metrics=on_metrics,
        should_cancel=lambda: cancel_requested(factory, claim),
        save_checkpoint=save_checkpoint,
        checkpoint_every=settings.training_checkpoint_every,
        resume_from=resume[1] if resume is not None else None,
        method=spec.method,
        early_stopping_patience=spec.early_stopping_patience,
        start_from=start_from,
    )
    run_seconds = time.monotonic() - started
    if result.status is TrainStatus.CANCELLED:
        _end_stopped(factory, claim, result, last_metrics)
        return
    if stop_request(factory, claim) is FineTuningJobStatus.cancel_requested:
        # Cancelled during the last step: keep the work as a checkpoint only. (A pause asked then has
        # nothing left to pause: the job completes.)
        if result.steps % settings.training_checkpoint_every:  # else the last step saved one already
            save_checkpoint(result.steps, result.adapter_dir)
        with factory() as session:
            if finish_job(session, claim, FineTuningJobStatus.cancelled, trained_tokens=result.trained_tokens,
                          metrics=last_metrics or None, message="The job was cancelled after its last step"):
                session.commit()
        return
    promotion = None if spec.promote is None else JobPromotion(
        job_id=claim.job_id, tenant_id=spec.tenant_id, adapter=spec.suffix, actor_key_id=spec.actor_key_id,
        promotion=spec.promote)
    reading: GateReading | None = None
    if promotion is not None and promotion.promotion.when == VALID_LOSS_IMPROVES:
        from loraloom.platform.training.gate_evaluation import version_losses

        # Measured before publishing: a run that dies while measuring is retried without a version published.
        reading = read_gate(factory, store, promotion, work_dir / "gate", lambda versions: version_losses(
            base_model_dir=model_dir, eval_examples=eval_examples, hyperparameters=hyperparameters,
            method=spec.method, seed=spec.seed, start_from=start_from, versions=versions))
    base = ServedBase(name=model_dir.name, config=ModelConfig.from_dir(model_dir),
                      max_lora_rank=context.max_lora_rank)
    with factory() as session:
        version = publish_adapter_dir(
            session, store=store, tenant_id=spec.tenant_id, adapter_name=spec.suffix, directory=result.adapter_dir,
            base=base, source=AdapterVersionSource.training, training_job_id=claim.job_id,
            actor_key_id=spec.actor_key_id,
        ).version
        reference = f"{spec.suffix}@{version.number}"
        if promotion is not None:
            promote(factory, promotion, number=version.number, new_loss=result.full_valid_loss, reading=reading)
        if finish_job(session, claim, FineTuningJobStatus.succeeded, result_version_id=version.id,
                      fine_tuned_model=reference, trained_tokens=result.trained_tokens, metrics=last_metrics or None,
                      message=f"The job has successfully completed: the adapter is {reference} ({spec.suffix}:latest); "
                              f"download it with `loraloom adapters pull {reference} DIR`"):
            session.commit()
        else:
            logger.warning("job %s: registered %s but the job was taken away meanwhile", claim.job_id, reference,
                           extra={"job_id": claim.job_id})
            return
    if resume is None:  # a run of the whole job: its time is what an estimate of such a job should say
        record_run(factory, spec.tenant_id, spec.model, tokens=result.trained_tokens,
                   training_seconds=result.training_seconds, startup_seconds=run_seconds - result.training_seconds)


def _end_stopped(factory: sessionmaker[Session], claim: Claim, result: Any, last_metrics: dict[str, Any]) -> None:
    """The run stopped between steps on the user's request: end the job paused or cancelled, as asked.
    Its checkpoint of the steps done (the trainer saved it) is where a resume continues."""
    paused = stop_request(factory, claim) is FineTuningJobStatus.pause_requested
    with factory() as session:
        if paused:
            ended = finish_job(
                session, claim, FineTuningJobStatus.paused, finished_at=None, trained_tokens=result.trained_tokens,
                metrics=last_metrics or None,
                message=f"The job was paused after step {result.steps} of {result.total_steps}; resume it with "
                        f"POST /v1/fine_tuning/jobs/{claim.job_id}/resume",
            )
        else:
            ended = finish_job(session, claim, FineTuningJobStatus.cancelled, trained_tokens=result.trained_tokens,
                               metrics=last_metrics or None,
                               message=f"The job was cancelled after step {result.steps} of {result.total_steps}")
        if ended:
            session.commit()
