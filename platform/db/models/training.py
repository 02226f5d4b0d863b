"""Fine-tuning: uploaded training files, jobs, their event logs and checkpoints."""
from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Double, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from loraloom.platform.db.models.base import Base, BigIntId, JSONDocument, enum_column, utcnow


class FineTuningJobStatus(str, enum.Enum):
    """OpenAI's statuses (paused among them), plus cancel_requested and pause_requested: the worker has
    been asked to stop and has not yet. `paused` is a rest state like the finished ones: no worker holds
    the job, and only a resume (back to queued) moves it on."""

    validating_files = "validating_files"
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancel_requested = "cancel_requested"
    cancelled = "cancelled"
    pause_requested = "pause_requested"
    paused = "paused"

    @property
    def finished(self) -> bool:
        return self in (FineTuningJobStatus.succeeded, FineTuningJobStatus.failed, FineTuningJobStatus.cancelled)


class TrainingFile(Base):
    """An uploaded dataset (`/v1/files`), validated at upload against the served base's tokenizer.
    The bytes are a content-addressed blob (`sha256`); the counts come from the validation."""

    __tablename__ = "files"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "file-<hex>"
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)  # indexed: "is this blob still referenced?"
    format: Mapped[str] = mapped_column(String(16))  # chat | instruction | text | preference
    line_count: Mapped[int]
    token_count: Mapped[int]
    # Jobs check their max_seq_len against it without reading the file again.
    max_example_tokens: Mapped[int]
    created_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FineTuningJob(Base):
    """A training run and everything the worker reports about it: the database, not Celery's
    result backend, holds job state (results expire and are per broker; the API reads jobs here).

    A worker owns a job while `run_token` is the token it claimed it with: every write a
    worker makes is conditioned on it, so a run whose job was taken away (requeued after a
    missed heartbeat) can no longer change anything.
    """

    __tablename__ = "fine_tuning_jobs"
    __table_args__ = (Index(None, "tenant_id", "created_at"), Index(None, "status", "heartbeat_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ftjob-<hex>"
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    created_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    model: Mapped[str] = mapped_column(String(256))  # the base model
    # File ids without foreign keys: a file may be deleted once its jobs are finished (as at OpenAI).
    training_file: Mapped[str] = mapped_column(String(40))
    validation_file: Mapped[str | None] = mapped_column(String(40))
    suffix: Mapped[str] = mapped_column(String(128))  # the adapter the result is registered under
    seed: Mapped[int] = mapped_column(BigInteger)
    hyperparameters: Mapped[dict[str, Any]]
    status: Mapped[FineTuningJobStatus] = mapped_column(
        enum_column(FineTuningJobStatus, "fine_tuning_job_status"), default=FineTuningJobStatus.queued
    )
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_param: Mapped[str | None] = mapped_column(String(128))
    attempts: Mapped[int] = mapped_column(default=0)  # runs started; bounded by max_attempts
    max_attempts: Mapped[int]
    run_token: Mapped[str | None] = mapped_column(String(32))
    worker_id: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None]
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # The last step's metrics (train and eval loss, step, epoch ...), part of the result's lineage.
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument)
    result_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("adapter_versions.id", ondelete="SET NULL")
    )
    fine_tuned_model: Mapped[str | None] = mapped_column(String(256))  # "suffix@N", a reference to serve
    # OpenAI's `method.type`: supervised | dpo. The hyperparameters above are that method's.
    method: Mapped[str] = mapped_column(String(16), default="supervised")
    # The user's own labels (OpenAI's `metadata`: up to 16 string pairs). "metadata" is taken by the
    # declarative base, hence the attribute's name.
    job_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONDocument)
    early_stopping_patience: Mapped[int | None]  # evaluations without a better validation loss before stopping
    # The checkpoint whose LoRA weights the job starts from (ftckpt-..., of the same tenant). No foreign key,
    # as with the files: the job keeps naming it when it is gone.
    from_checkpoint: Mapped[str | None] = mapped_column(String(40))
    # The alias of `suffix` the job moves to its version on success (training/promotion.py), and when:
    # valid_loss_improves | always. Both None: the job promotes nothing.
    promote_alias: Mapped[str | None] = mapped_column(String(64))
    promote_when: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class FineTuningJobEvent(Base):
    """One line of a job's log: a message, or the metrics of one step (type "metrics", data holds them)."""

    __tablename__ = "fine_tuning_job_events"
    __table_args__ = (Index(None, "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)  # increasing: orders the events
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id", ondelete="CASCADE"))
    level: Mapped[str] = mapped_column(String(8))  # info | warn | error
    type: Mapped[str] = mapped_column(String(16))  # message | metrics
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FineTuningCheckpoint(Base):
    """A PEFT adapter saved during training; its two files are content-addressed blobs."""

    __tablename__ = "fine_tuning_checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ftckpt-<hex>"
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id", ondelete="CASCADE"))
    step: Mapped[int]
    metrics: Mapped[dict[str, Any]]
    config_sha256: Mapped[str] = mapped_column(String(64))  # adapter_config.json
    weights_sha256: Mapped[str] = mapped_column(String(64), index=True)  # adapter_model.safetensors
    weights_size_bytes: Mapped[int] = mapped_column(BigInteger)
    # The run's optimizer, schedule and RNG state (training/resume.py), which a retry resumes from.
    # Never served; None for checkpoints saved before training states were kept.
    training_state_sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingThroughput(Base):
    """Per tenant and base model, the training speed measured on this deployment: a moving average over
    the tenant's jobs that succeeded (tokens trained per second of a run), which its estimates divide a
    job's tokens by. Per tenant: a rate shared by all would tell each tenant when another's job ended."""

    __tablename__ = "training_throughput"

    tenant_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    tokens_per_second: Mapped[float] = mapped_column(Double)  # of the optimizer loop
    startup_seconds: Mapped[float] = mapped_column(Double)  # before the loop: loading the model
    runs: Mapped[int]  # runs averaged so far
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
