"""/v1/fine_tuning/jobs: jobs, their events and checkpoints, in OpenAI's shapes; and the estimate of a job."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator

from loraloom.platform.api.schemas.common import (
    IdPageObject,
    PageObject,
    StrictBody,
    documented_pattern,
    unix_seconds,
)
from loraloom.platform.db.models import FineTuningCheckpoint, FineTuningJob, FineTuningJobEvent
from loraloom.platform.registry.references import ALIAS_NAME_PATTERN, LATEST_ALIAS
from loraloom.platform.training.estimate import Estimate
from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters
from loraloom.platform.training.job_options import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    choose_hyperparameters,
)
from loraloom.platform.training.jobs import event_id
from loraloom.platform.training.methods import METHODS, SUPERVISED
from loraloom.platform.training.promotion import VALID_LOSS_IMPROVES, Promotion

Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=MAX_METADATA_KEY_CHARS)],
         Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)]],
    Field(max_length=MAX_METADATA_PAIRS, description=f"Your labels for the job: up to {MAX_METADATA_PAIRS} string "
          f"pairs, keys up to {MAX_METADATA_KEY_CHARS} characters, values up to {MAX_METADATA_VALUE_CHARS}."),
]


class SupervisedMethod(StrictBody):
    hyperparameters: Hyperparameters | None = Field(default=None, description="Default: every default.")


class DpoMethod(StrictBody):
    hyperparameters: DpoHyperparameters | None = Field(default=None, description="Default: every default.")


class Method(StrictBody):
    """OpenAI's `method`: the training objective, and its hyperparameters under the key named by `type`."""

    type: Literal["supervised", "dpo"] = Field(
        description="supervised: learn the assistant answers of chat, instruction or text files. dpo: learn to "
        "prefer the chosen answer of preference pairs over the rejected one.")
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None

    @model_validator(mode="after")
    def _only_its_own_key(self) -> Method:
        for other in METHODS:
            if other != self.type and getattr(self, other) is not None:
                raise ValueError(f"method.{other} is given for a {self.type} job; put its settings in method.{self.type}")
        return self

    def hyperparameters(self) -> Hyperparameters | None:
        given = getattr(self, self.type)
        return None if given is None else given.hyperparameters


class EarlyStopping(StrictBody):
    patience: int = Field(ge=1, le=1000, description="Evaluations in a row without a better validation loss "
                          "after which training stops (needs a validation_file).")


class Promote(StrictBody):
    """An alias of the job's adapter (`suffix`) to move to the job's version when the job succeeds."""

    alias: str = Field(description="The alias, e.g. prod (not `latest`, which moves by itself); created if new.",
                       json_schema_extra={**documented_pattern(ALIAS_NAME_PATTERN), "not": {"const": LATEST_ALIAS}})
    when: Literal["valid_loss_improves", "always"] = Field(
        default=VALID_LOSS_IMPROVES,
        description="valid_loss_improves (needs a validation_file): only if the job's version has a strictly lower "
        "validation loss than each version the alias names now, measured on the job's validation file with the job's "
        "own loss; a new alias is created. always: unconditionally. The decision is in the alias's history and the "
        "job's `promotion` event; a gate that cannot measure skips the promotion, never fails the job.")

    def promotion(self) -> Promotion:
        return Promotion(alias=self.alias, when=self.when)


class JobCreateBody(StrictBody):
    model: str = Field(description="The base model: the one this server serves, by its name or as `base`.")
    training_file: str = Field(description="A file id from POST /v1/files (purpose fine-tune).")
    validation_file: str | None = Field(default=None, description="A file id; its loss is reported as eval loss.")
    suffix: str | None = Field(default=None, description="The adapter the result is registered under, as its next "
                               "version. Default: a new name, `ft-` and 8 hex digits.")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Same seed, same data: same adapter.")
    hyperparameters: Hyperparameters | None = Field(
        default=None,
        description="A supervised job's (as method.supervised.hyperparameters; give them in one place). Ours, or "
        "OpenAI's spelling: `\"auto\"` for n_epochs, batch_size or learning_rate_multiplier means the default, and "
        "learning_rate_multiplier scales the default learning rate.",
    )
    method: Method | None = Field(default=None, description="Default: supervised.")
    metadata: Metadata | None = None
    early_stopping: EarlyStopping | None = Field(default=None, description="Stop once the validation loss stops "
                                                 "improving; the job's adapter is then the best evaluation's weights.")
    from_checkpoint: str | None = Field(
        default=None, max_length=40, description="A checkpoint id (ftckpt-...) of one of your jobs: the LoRA weights "
        "start from it (the optimizer and schedule start afresh). Its rank and target modules must be this job's.")
    promote: Promote | None = None

    def method_type(self) -> str:
        return SUPERVISED if self.method is None else self.method.type

    def chosen_hyperparameters(self) -> Hyperparameters:
        """The method's hyperparameters; raises TrainingInputError (param `hyperparameters`) if given twice."""
        of_method = None if self.method is None else self.method.hyperparameters()
        return choose_hyperparameters(self.method_type(), self.hyperparameters, of_method)

    def early_stopping_patience(self) -> int | None:
        return None if self.early_stopping is None else self.early_stopping.patience

    def promotion(self) -> Promotion | None:
        return None if self.promote is None else self.promote.promotion()


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
        description="The last step's metrics (step, total_steps, train_loss, train_mean_token_accuracy, valid_loss "
        "and full_valid_loss where evaluated, eval_loss the same as valid_loss, tokens_per_second, eta_seconds...), "
        "updated after every step while the job runs."
    )
    method: dict[str, Any] = Field(description="OpenAI's shape: the type, and under it the hyperparameters used.")
    metadata: dict[str, str] | None
    early_stopping: EarlyStopping | None
    from_checkpoint: str | None
    promote: Promote | None

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
            method={"type": job.method, job.method: {"hyperparameters": job.hyperparameters}},
            metadata=job.job_metadata,
            early_stopping=None if job.early_stopping_patience is None else EarlyStopping(
                patience=job.early_stopping_patience),
            from_checkpoint=job.from_checkpoint,
            promote=None if job.promote_alias is None else Promote(alias=job.promote_alias, when=job.promote_when),
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


class EstimateObject(BaseModel):
    """What a job would train and how long it would take, before it is created."""

    object: Literal["fine_tuning.estimate"] = "fine_tuning.estimate"
    model: str
    method: str
    trained_tokens: int = Field(description="n_epochs x the training file's tokens + evaluations x the validation "
                                "file's: the finished job's trained_tokens, unless it stops early.")
    training_tokens: int = Field(description="The training file's tokens (one epoch).")
    validation_tokens: int = Field(description="The validation file's tokens (one evaluation).")
    n_epochs: int
    total_steps: int
    evaluations: int = Field(description="How many times the validation file is evaluated.")
    estimated_seconds: float = Field(description="startup_seconds + trained_tokens / tokens_per_second.")
    tokens_per_second: float = Field(description="This server's training rate for the model and your tenant, once "
                                     "training runs.")
    startup_seconds: float = Field(description="What a run takes before it trains (loading the model).")
    rate_source: Literal["measured", "default"] = Field(
        description="measured: a moving average over your finished jobs of the model on this server; default: none "
        "has finished here yet, a rough guess.")

    @classmethod
    def of(cls, estimate: Estimate, *, model: str, method: str) -> EstimateObject:
        return cls(
            model=model, method=method, trained_tokens=estimate.trained_tokens,
            training_tokens=estimate.training_tokens, validation_tokens=estimate.validation_tokens,
            n_epochs=estimate.n_epochs, total_steps=estimate.total_steps, evaluations=estimate.evaluations,
            estimated_seconds=estimate.estimated_seconds, tokens_per_second=estimate.rate.tokens_per_second,
            startup_seconds=estimate.rate.startup_seconds,
            rate_source="measured" if estimate.rate.measured else "default",
        )
