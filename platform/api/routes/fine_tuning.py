"""/v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume, events, checkpoints, in OpenAI's
shapes; /v1/fine_tuning/estimate: what a job would train and how long it would take, before creating it.

A job trains a LoRA adapter on the served base; on success the adapter becomes the next
version of adapter `suffix` in the caller's tenant (`fine_tuned_model` is "suffix@N").
`error.code` tells the user's faults (invalid_training_file, invalid_hyperparameters,
training_diverged, file_not_found ...) from the system's (system_error, worker_lost,
time_limit_exceeded), which retrying may fix.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from loraloom.engine import EngineClient
from loraloom.platform.api.deps import DeveloperDep, EngineDep, JobSenderDep, RegistryDep, SessionDep, SettingsDep
from loraloom.platform.api.errors import APIError
from loraloom.platform.api.schemas.common import DEFAULT_PAGE_SIZE, ErrorResponse, PageLimit, documented_pattern
from loraloom.platform.api.schemas.fine_tuning import (
    CheckpointList,
    CheckpointObject,
    EventList,
    EstimateObject,
    EventObject,
    JobCreateBody,
    JobList,
    JobObject,
)
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.training.estimate import estimate_job
from loraloom.platform.training.lifecycle import pause_job, resume_job
from loraloom.platform.training.jobs import (
    EVENT_CURSOR,
    ServedModel,
    cancel_job,
    create_job,
    find_job,
    list_checkpoints,
    list_events,
    list_jobs,
)


router = APIRouter(
    tags=["fine-tuning"],
    responses={status: {"model": ErrorResponse} for status in (400, 404, 409, 500)},
)


def served_model(engine: EngineClient) -> ServedModel:
    return ServedModel(name=engine.model_name, max_lora_rank=engine.max_lora_rank,
                       reserved_names=ALWAYS_BASE_NAMES | {engine.model_name})


@contextmanager
def missing_checkpoint_is_404() -> Iterator[None]:
    """A `from_checkpoint` that is not the caller's answers as a missing resource does (404), naming the field."""
    try:
        yield
    except TrainingInputError as error:
        if error.code != "checkpoint_not_found":
            raise
        raise APIError(404, error.message, param=error.param, code=error.code) from None


@router.post("/v1/fine_tuning/jobs", response_model=JobObject)
def post_job(
    body: JobCreateBody,
    caller: DeveloperDep,
    session: SessionDep,
    engine: EngineDep,
    settings: SettingsDep,
    registry: RegistryDep,
    send: JobSenderDep,
) -> JobObject:
    with missing_checkpoint_is_404():
        job = create_job(
            session, tenant_id=caller.tenant_id, actor_key_id=caller.api_key_id, served=served_model(engine),
            model=body.model, training_file=body.training_file, validation_file=body.validation_file,
            suffix=body.suffix, seed=body.seed, hyperparameters=body.chosen_hyperparameters(),
            max_attempts=settings.training_max_attempts, send=send, method=body.method_type(),
            metadata=body.metadata, early_stopping_patience=body.early_stopping_patience(),
            from_checkpoint=body.from_checkpoint, store=registry.store, promote=body.promotion(),
        )
    return JobObject.of(job)


@router.post("/v1/fine_tuning/estimate", response_model=EstimateObject)
def post_estimate(
    body: JobCreateBody, caller: DeveloperDep, session: SessionDep, engine: EngineDep, registry: RegistryDep
) -> EstimateObject:
    """A job's create body, checked as creating the job would check it, answered with what the job would
    train (its trained_tokens, steps and evaluations) and how long that would take here. Creates nothing."""
    served = served_model(engine)
    with missing_checkpoint_is_404():
        estimate = estimate_job(
            session, store=registry.store, tokenizer=engine.tokenizer, tenant_id=caller.tenant_id, served=served,
            model=body.model, training_file=body.training_file, validation_file=body.validation_file,
            suffix=body.suffix, hyperparameters=body.chosen_hyperparameters(), method=body.method_type(),
            early_stopping_patience=body.early_stopping_patience(), from_checkpoint=body.from_checkpoint,
            promote=body.promotion(),
        )
    return EstimateObject.of(estimate, model=served.name, method=body.method_type())


@router.get("/v1/fine_tuning/jobs", response_model=JobList)
def get_jobs(
    caller: DeveloperDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last job id of the previous page.")] = None,
) -> JobList:
    page = list_jobs(session, tenant_id=caller.tenant_id, limit=limit, after=after)
    return JobList.of(page, JobObject.of)


@router.get("/v1/fine_tuning/jobs/{job_id}", response_model=JobObject)
def get_job(job_id: str, caller: DeveloperDep, session: SessionDep) -> JobObject:
    return JobObject.of(find_job(session, tenant_id=caller.tenant_id, job_id=job_id))


@router.post("/v1/fine_tuning/jobs/{job_id}/cancel", response_model=JobObject)
def post_cancel(job_id: str, caller: DeveloperDep, session: SessionDep) -> JobObject:
    """A queued job is cancelled at once; a running one becomes cancel_requested and its worker
    stops after the current step, saves a checkpoint and ends it cancelled."""
    return JobObject.of(cancel_job(session, tenant_id=caller.tenant_id, job_id=job_id))


@router.post("/v1/fine_tuning/jobs/{job_id}/pause", response_model=JobObject)
def post_pause(job_id: str, caller: DeveloperDep, session: SessionDep) -> JobObject:
    """A queued job is paused at once; a running one becomes pause_requested and its worker stops after
    the current step, saves a checkpoint and ends it paused. 409 for a job in any other state."""
    return JobObject.of(pause_job(session, tenant_id=caller.tenant_id, job_id=job_id))


@router.post("/v1/fine_tuning/jobs/{job_id}/resume", response_model=JobObject)
def post_resume(
    job_id: str, caller: DeveloperDep, session: SessionDep, settings: SettingsDep, send: JobSenderDep
) -> JobObject:
    """A paused, failed or cancelled job is queued again; its run continues from its last checkpoint
    (weights, optimizer, schedule, RNG and data position). 409 for a job in any other state."""
    return JobObject.of(resume_job(session, tenant_id=caller.tenant_id, job_id=job_id,
                                   max_attempts=settings.training_max_attempts, send=send))


@router.get("/v1/fine_tuning/jobs/{job_id}/events", response_model=EventList)
def get_events(
    job_id: str,
    caller: DeveloperDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last event id of the previous page.",
                                       json_schema_extra=documented_pattern(EVENT_CURSOR))] = None,
    order: Annotated[Literal["asc", "desc"], Query(description="desc (newest first, OpenAI's) or asc.")] = "desc",
) -> EventList:
    page = list_events(session, tenant_id=caller.tenant_id, job_id=job_id, limit=limit, after=after, order=order)
    return EventList.of(page, EventObject.of)


@router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints", response_model=CheckpointList)
def get_checkpoints(
    job_id: str,
    caller: DeveloperDep,
    session: SessionDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last checkpoint id of the previous page.")] = None,
) -> CheckpointList:
    page = list_checkpoints(session, tenant_id=caller.tenant_id, job_id=job_id, limit=limit, after=after)
    return CheckpointList.of(page, CheckpointObject.of)
