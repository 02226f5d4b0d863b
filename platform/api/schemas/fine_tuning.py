"""/v1/fine_tuning/jobs: jobs, their events and checkpoints, in OpenAI's shapes."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from loraloom.platform.api.schemas.common import IdPageObject, PageObject, StrictBody, unix_seconds
from loraloom.platform.db.models import FineTuningCheckpoint, FineTuningJob, FineTuningJobEvent
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import event_id


class JobCreateBody(StrictBody):
    model: str = Field(description="The base model: the one this server serves, by its name or as `base`.")
    training_file: str = Field(description="A file id from POST /v1/files (purpose fine-tune).")
    validation_file: str | None = Field(default=None, description="A file id; its loss is reported as eval loss.")
    suffix: str | None = Field(default=None, description="The adapter the result is registered under, as its next "
                               "version. Default: a new name, `ft-` and 8 hex digits.")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Same seed, same data: same adapter.")
    hyperparameters: Hyperparameters = Field(
        default_factory=Hyperparameters,
        description="Ours, or OpenAI's spelling: `\"auto\"` for n_epochs, batch_size or learning_rate_multiplier "
        "means the default, and learning_rate_multiplier scales the default learning rate.",
    )


class JobError(BaseModel):
    code: str
    message: str
    param: str | None


class JobObject(BaseModel):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str
    created_at: int
    finished_at: int | None
    model: str
    fine_tuned_model: str | None = Field(description="The trained adapter as a reference to serve: suffix@N.")
    organization_id: str = Field(description="The tenant.")
    status: str
    hyperparameters: dict[str, Any]
    training_file: str
    validation_file: str | None
    result_files: list[str] = Field(
        default_factory=list,
        description="Once succeeded, the trained adapter version's reference, suffix@N (the same as "
        "fine_tuned_model): `loraloom adapters pull suffix@N DIR` downloads it as a PEFT directory, as does "
        "GET /v1/adapters/{suffix}/versions/{N}/content (a .tar.gz). Empty until then.",
    )
    trained_tokens: int | None
    error: JobError | None
    seed: int
    suffix: str
    attempts: int = Field(description="Runs started so far (a run whose worker died is retried).")
    max_attempts: int
    metrics: dict[str, Any] | None = Field(
        description="The last step's metrics (step, total_steps, train_loss, eval_loss, tokens_per_second, "
        "eta_seconds...), updated after every step while the job runs."
    )

    @classmethod
    def of(cls, job: FineTuningJob) -> JobObject:
        error = None
        if job.error_code is not None:
            error = JobError(code=job.error_code, message=job.error_message or "", param=job.error_param)
        return cls(
            id=job.id, created_at=unix_seconds(job.created_at), finished_at=unix_seconds(job.finished_at),
            model=job.model, fine_tuned_model=job.fine_tuned_model, organization_id=str(job.tenant_id),
            status=job.status.value, hyperparameters=job.hyperparameters, training_file=job.training_file,
            validation_file=job.validation_file, trained_tokens=job.trained_tokens, error=error, seed=job.seed,
            suffix=job.suffix, attempts=job.attempts, max_attempts=job.max_attempts, metrics=job.metrics,
            result_files=[job.fine_tuned_model] if job.fine_tuned_model is not None else [],
        )


class JobList(PageObject[JobObject]):
    pass


class EventObject(BaseModel):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str
    created_at: int
    level: str
    message: str
    type: str
    data: dict[str, Any] | None

    @classmethod
    def of(cls, event: FineTuningJobEvent) -> EventObject:
        return cls(id=event_id(event), created_at=unix_seconds(event.created_at), level=event.level,
                   message=event.message, type=event.type, data=event.data)


class EventList(PageObject[EventObject]):
    pass


class CheckpointObject(BaseModel):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str = Field(description="Pass as `model` to chat with this checkpoint.")
    fine_tuning_job_id: str
    step_number: int
    metrics: dict[str, Any]

    @classmethod
    def of(cls, checkpoint: FineTuningCheckpoint) -> CheckpointObject:
        return cls(id=checkpoint.id, created_at=unix_seconds(checkpoint.created_at),
                   fine_tuned_model_checkpoint=checkpoint.id, fine_tuning_job_id=checkpoint.job_id,
                   step_number=checkpoint.step, metrics=checkpoint.metrics)


class CheckpointList(IdPageObject[CheckpointObject]):
    pass
