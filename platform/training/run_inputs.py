"""What a run reads before it trains: the job's spec, its files, and the checkpoint it starts from,
either its own last one (a retry or a resume: weights and the run's whole state) or, for a job
created `from_checkpoint`, another job's (LoRA weights only: a fresh optimizer and schedule)."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db.models import FineTuningCheckpoint, FineTuningJob, TrainingFile
from loraloom.platform.storage import BlobNotFoundError, BlobStore, BlobVerificationError, content_key
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.job_options import hyperparameters_of
from loraloom.platform.training.job_state import Claim, ResumePoint, add_event, resume_point
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.promotion import Promotion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    tenant_id: uuid.UUID
    actor_key_id: uuid.UUID | None
    model: str
    training_file: str
    validation_file: str | None
    suffix: str
    seed: int
    method: str
    hyperparameters: Hyperparameters
    early_stopping_patience: int | None
    from_checkpoint: str | None
    promote: Promotion | None = None


def load_spec(factory: sessionmaker[Session], claim: Claim) -> JobSpec:
    with factory() as session:
        job = session.get(FineTuningJob, claim.job_id)
        assert job is not None, "a claimed job exists"
        return JobSpec(
            tenant_id=job.tenant_id, actor_key_id=job.created_by_key_id, model=job.model,
            training_file=job.training_file, validation_file=job.validation_file, suffix=job.suffix, seed=job.seed,
            method=job.method, hyperparameters=hyperparameters_of(job.method, job.hyperparameters),
            early_stopping_patience=job.early_stopping_patience, from_checkpoint=job.from_checkpoint,
            promote=None if job.promote_alias is None else Promotion(job.promote_alias, job.promote_when),
        )


def read_file(factory: sessionmaker[Session], store: BlobStore, spec: JobSpec, file_id: str, param: str) -> bytes:
    with factory() as session:
        row = session.get(TrainingFile, file_id)
    if row is None or row.tenant_id != spec.tenant_id:
        raise TrainingInputError(code="file_not_found", param=param,
                                 message=f"{param}: file {file_id} was deleted before the job ran; upload it again")
    with store.open(content_key(row.sha256)) as blob:
        return blob.read()


def fetch_resume_point(
    factory: sessionmaker[Session], store: BlobStore, claim: Claim, work_dir: Path
) -> tuple[ResumePoint, Path] | None:
    """The job's last checkpoint with its training state, downloaded for train_lora's resume_from;
    None when this run starts from step 1 (the first run, or no checkpoint can be resumed)."""
    from loraloom.platform.training.resume import TRAINING_STATE_FILE  # imports torch: the worker's child only

    point = resume_point(factory, claim.job_id)
    if point is None:
        return None
    directory = work_dir / f"resume-{point.step}"
    try:
        for name, sha256 in ((ADAPTER_CONFIG_FILE, point.config_sha256), (ADAPTER_WEIGHTS_FILE, point.weights_sha256),
                             (TRAINING_STATE_FILE, point.training_state_sha256)):
            store.get_to_path(content_key(sha256), directory / name)
    except (BlobNotFoundError, BlobVerificationError):
        logger.exception("job %s: checkpoint %s cannot be read back", claim.job_id, point.checkpoint_id,
                         extra={"job_id": claim.job_id})
        job_event(factory, claim, f"Checkpoint {point.checkpoint_id} could not be read back; training starts over "
                                  "from step 1", level="warn")
        return None
    job_event(factory, claim, f"Resuming from checkpoint {point.checkpoint_id} at step {point.step}",
              data={"checkpoint": point.checkpoint_id, "step": point.step})
    return point, directory


def fetch_start_checkpoint(
    factory: sessionmaker[Session], store: BlobStore, claim: Claim, spec: JobSpec, work_dir: Path
) -> Path:
    """The LoRA files of the job's `from_checkpoint`, downloaded for train_lora's start_from."""
    assert spec.from_checkpoint is not None
    with factory() as session:
        checkpoint = session.scalar(
            select(FineTuningCheckpoint)
            .join(FineTuningJob, FineTuningJob.id == FineTuningCheckpoint.job_id)
            .where(FineTuningCheckpoint.id == spec.from_checkpoint, FineTuningJob.tenant_id == spec.tenant_id)
        )
    if checkpoint is None:
        raise TrainingInputError(code="checkpoint_not_found", param="from_checkpoint",
                                 message=f"from_checkpoint: checkpoint {spec.from_checkpoint} was deleted before the "
                                         "job ran")
    directory = work_dir / "start-from"
    for name, sha256 in ((ADAPTER_CONFIG_FILE, checkpoint.config_sha256),
                         (ADAPTER_WEIGHTS_FILE, checkpoint.weights_sha256)):
        store.get_to_path(content_key(sha256), directory / name)
    job_event(factory, claim, f"Starting from the weights of checkpoint {checkpoint.id} (step {checkpoint.step} of "
                              f"job {checkpoint.job_id})", data={"checkpoint": checkpoint.id})
    return directory


def job_event(factory: sessionmaker[Session], claim: Claim, message: str, **fields: Any) -> None:
    with factory.begin() as session:
        add_event(session, claim.job_id, message, **fields)
