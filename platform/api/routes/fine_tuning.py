"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, events, checkpoints, in OpenAI's shapes.

A job trains a LoRA adapter on the served base; on success the adapter becomes the next
version of adapter `suffix` in the caller's tenant (`fine_tuned_model` is "suffix@N").
`error.code` tells the user's faults (invalid_training_file, invalid_hyperparameters,
training_diverged, file_not_found ...) from the system's (system_error, worker_lost,
time_limit_exceeded), which retrying may fix.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from celery import Celery
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from loraloom.platform.api.deps import CallerDep, DeveloperDep, EngineDep, SessionDep, SettingsDep
from loraloom.platform.api.schemas import (
    DEFAULT_PAGE_SIZE,
    ErrorResponse,
    IdPageObject,
    PageLimit,
    PageObject,
    StrictBody,
    unix_seconds,
)
from loraloom.platform.api.training_errors import TrainingRoute
from loraloom.platform.db.models import FineTuningCheckpoint, FineTuningJob, FineTuningJobEvent
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES
from loraloom.platform.training.celery_app import send_run_job
from loraloom.platform.training.hyperparameters import Hyperparameters
from loraloom.platform.training.jobs import (
    ServedModel,
    cancel_job,
    create_job,
    event_id,
    find_job,
    list_checkpoints,
    list_events,
    list_jobs,
)


router = APIRouter(
    tags=["fine-tuning"],
    route_class=TrainingRoute,
    responses={status: {"model": ErrorResponse} for status in (400, 404, 409, 500)},
)


def get_job_sender(request: Request) -> Callable[[str], None]:
    app: Celery = request.app.state.training_app
    return lambda job_id: send_run_job(app, job_id)


JobSenderDep = Annotated[Callable[[str], None], Depends(get_job_sender)]


class JobCreateBody(StrictBody):
    model: str = Field(description="The base model: the one this server serves.")
    training_file: str = Field(description="A file id from POST /v1/files (purpose fine-tune).")
    validation_file: str | None = Field(default=None, description="A file id; its loss is reported as eval loss.")
    suffix: str = Field(description="The adapter the result is registered under, as its next version.")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Same seed, same data: same adapter.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)


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
    result_files: list[str] = Field(default_factory=list)
    trained_tokens: int | None
    error: JobError | None
    seed: int
    suffix: str
    attempts: int = Field(description="Runs started so far (a run whose worker died is retried).")
    max_attempts: int
    metrics: dict[str, Any] | None = Field(description="The last step's metrics.")

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


@router.post("/v1/fine_tuning/jobs", response_model=JobObject)
def post_job(
    body: JobCreateBody,
    caller: DeveloperDep,
    session: SessionDep,
    engine: EngineDep,
    settings: SettingsDep,
    send: JobSenderDep,
) -> JobObject:
    served = ServedModel(
        name=engine.model_name, max_lora_rank=engine.config.max_lora_rank,
        reserved_names=ALWAYS_BASE_NAMES | {engine.model_name},
    )
    job = create_job(
        session, tenant_id=caller.tenant_id, actor_key_id=caller.api_key_id, served=served, model=body.model,
        training_file=body.training_file, validation_file=body.validation_file, suffix=body.suffix, seed=body.seed,
        hyperparameters=body.hyperparameters, max_attempts=settings.training_max_attempts, send=send,
    )
    return JobObject.of(job)


@router.get("/v1/fine_tuning/jobs", response_model=JobList)
def get_jobs(
    caller: CallerDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last job id of the previous page.")] = None,
) -> JobList:
    page = list_jobs(session, tenant_id=caller.tenant_id, limit=limit, after=after)
    return JobList.of(page, JobObject.of)


@router.get("/v1/fine_tuning/jobs/{job_id}", response_model=JobObject)
def get_job(job_id: str, caller: CallerDep, session: SessionDep) -> JobObject:
    return JobObject.of(find_job(session, tenant_id=caller.tenant_id, job_id=job_id))


@router.post("/v1/fine_tuning/jobs/{job_id}/cancel", response_model=JobObject)
def post_cancel(job_id: str, caller: DeveloperDep, session: SessionDep) -> JobObject:
    """A queued job is cancelled at once; a running one becomes cancel_requested and its worker
    stops after the current step, saves a checkpoint and ends it cancelled."""
    return JobObject.of(cancel_job(session, tenant_id=caller.tenant_id, job_id=job_id))


@router.get("/v1/fine_tuning/jobs/{job_id}/events", response_model=EventList)
def get_events(
    job_id: str,
    caller: CallerDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last event id of the previous page.")] = None,
    order: Annotated[Literal["asc", "desc"], Query(description="desc (newest first, OpenAI's) or asc.")] = "desc",
) -> EventList:
    page = list_events(session, tenant_id=caller.tenant_id, job_id=job_id, limit=limit, after=after, order=order)
    return EventList.of(page, EventObject.of)


@router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints", response_model=CheckpointList)
def get_checkpoints(
    job_id: str,
    caller: CallerDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last checkpoint id of the previous page.")] = None,
) -> CheckpointList:
    page = list_checkpoints(session, tenant_id=caller.tenant_id, job_id=job_id, limit=limit, after=after)
    return CheckpointList.of(page, CheckpointObject.of)
