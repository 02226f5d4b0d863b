"""The control plane's tables, as typed SQLAlchemy 2.0 models.

Ownership runs tenant -> adapters -> versions -> files; aliases point a name at one version
of the same adapter. Versions are immutable once written (see _refuse_changes_to_immutable_columns);
only their status moves (pending -> ready | failed).

The two log tables (usage_records, audit_log) keep plain ids without foreign keys on
purpose: billing and audit history must outlive the tenants, keys and adapters they mention.

Any change here needs a new Alembic revision in migrations/versions; the test suite fails
while the models and the migrated schema differ.
"""
from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
    inspect,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names, so migrations can address constraints on every backend
# (SQLite's batch mode needs names to drop or alter them). Kept under PostgreSQL's 63 chars.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


MAX_DECLARED_BASE_CHARS = 1024  # a local training path can be long; a longer one is stored cut

class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL keeps the offset; SQLite stores text without one, so values are normalized
    to UTC on the way in and marked UTC on the way out. Naive datetimes are refused
    rather than guessed at.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"datetime {value.isoformat()} has no timezone; pass an aware datetime such as utcnow()")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


# JSONB on PostgreSQL (indexable, e.g. tag containment), plain JSON text elsewhere.
JSONDocument = JSON().with_variant(JSONB(), "postgresql")
# 64-bit ids for append-only tables; SQLite autoincrements only an INTEGER primary key.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")
# The largest integer either database holds (SQLite's INTEGER, PostgreSQL's BIGINT). A larger one
# from a client must be refused where it arrives: SQLite's driver raised OverflowError (a 500).
MAX_INT64 = 2**63 - 1


def _enum_column(enum_class: type[enum.Enum], name: str) -> Enum:
    # Stored as VARCHAR holding the enum's values: adding a value later needs no
    # PostgreSQL ALTER TYPE, and the same migration runs on SQLite.
    return Enum(
        enum_class,
        name=name,
        native_enum=False,
        length=16,
        values_callable=lambda members: [member.value for member in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONDocument, list[str]: JSONDocument}


class ApiKeyRole(str, enum.Enum):
    admin = "admin"  # everything in the tenant, including keys
    developer = "developer"  # manage adapters, aliases, training; run inference
    inference = "inference"  # inference only


class UsageStatus(str, enum.Enum):
    ok = "ok"  # generation ended normally (stop or length)
    error = "error"  # the engine refused or failed the request
    aborted = "aborted"  # the client went away (or the server shut down) before the end


class AdapterVersionStatus(str, enum.Enum):
    pending = "pending"  # registered, files not yet uploaded or verified
    ready = "ready"  # verified and servable
    failed = "failed"  # verification or validation refused it; see status_detail
    # Removed by its owner: its blobs are gone, the row stays so that the number is never reused
    # and alias_history keeps pointing at it.
    deleted = "deleted"


class AdapterVersionSource(str, enum.Enum):
    upload = "upload"
    training = "training"  # training_job_id names the job


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set by the operator: every key of the tenant is refused (403) until it is cleared (api/auth.py).
    suspended_at: Mapped[datetime | None]

    # Children are deleted with their parent by the database's ON DELETE CASCADE
    # (passive_deletes: the ORM does not load them first).
    api_keys: Mapped[list[ApiKey]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )
    adapters: Mapped[list[Adapter]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )
    # None: no limits set, the tenant is unlimited (platform/limits/).
    limits: Mapped[TenantLimits | None] = relationship(passive_deletes=True)


class ApiKey(Base):
    """A bearer key. Only its sha256 is stored (see api_keys.py); `prefix` is the visible start
    shown in listings so users can tell their keys apart."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[ApiKeyRole] = mapped_column(_enum_column(ApiKeyRole, "api_key_role"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")
    limits: Mapped[ApiKeyLimits | None] = relationship(passive_deletes=True)

    def is_usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


class Adapter(Base):
    __tablename__ = "adapters"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        # `support` and `Support` cannot coexist in a tenant: a name differing only in case is someone's
        # typo, and two such adapters would be told apart by case alone (registry/publish.py says which exists).
        Index("uq_adapters_tenant_id_folded_name", "tenant_id", text("lower(name)"), unique=True),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, default="")
    tags: Mapped[list[str]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    tenant: Mapped[Tenant] = relationship(back_populates="adapters")
    versions: Mapped[list[AdapterVersion]] = relationship(
        back_populates="adapter",
        order_by="AdapterVersion.number",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )
    aliases: Mapped[list[Alias]] = relationship(
        back_populates="adapter", cascade="all, delete-orphan", passive_deletes=True
    )


class AdapterVersion(Base):
    """One immutable set of adapter weights. `number` counts up per adapter from 1."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        UniqueConstraint("adapter_id", "number"),
        # Target of the aliases' composite foreign key: an alias may only name a version
        # of its own adapter, and the database itself enforces it.
        UniqueConstraint("adapter_id", "id"),
        CheckConstraint("number >= 1", name="number_positive"),
        CheckConstraint("rank >= 1", name="rank_positive"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    adapter_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"))
    number: Mapped[int]
    status: Mapped[AdapterVersionStatus] = mapped_column(
        _enum_column(AdapterVersionStatus, "adapter_version_status"), default=AdapterVersionStatus.pending
    )
    status_detail: Mapped[str | None] = mapped_column(Text)  # why it failed, for the user
    base_model: Mapped[str] = mapped_column(String(256))
    # adapter_config.json's base_model_name_or_path as uploaded (None: it names none). Not a test of
    # compatibility (the shapes are): shown as a warning where it names another model than base_model.
    declared_base_model: Mapped[str | None] = mapped_column(String(MAX_DECLARED_BASE_CHARS))
    rank: Mapped[int]
    alpha: Mapped[float] = mapped_column(Double)
    target_modules: Mapped[list[str]]
    dtype: Mapped[str] = mapped_column(String(16))
    source: Mapped[AdapterVersionSource] = mapped_column(_enum_column(AdapterVersionSource, "adapter_version_source"))
    # A plain id, no foreign key: a version outlives the job that trained it (jobs may be purged).
    training_job_id: Mapped[str | None] = mapped_column(String(64))
    created_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    adapter: Mapped[Adapter] = relationship(back_populates="versions")
    files: Mapped[list[AdapterVersionFile]] = relationship(
        back_populates="version",
        order_by="AdapterVersionFile.filename",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class AdapterVersionFile(Base):
    """One file of a version (adapter_config.json, adapter_model.safetensors). The blob's
    storage key is derived from sha256 (loraloom.platform.storage.content_key)."""

    __tablename__ = "adapter_version_files"
    __table_args__ = (UniqueConstraint("version_id", "filename"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    version_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("adapter_versions.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64), index=True)  # indexed: "is this blob still referenced?"
    size_bytes: Mapped[int] = mapped_column(BigInteger)

    version: Mapped[AdapterVersion] = relationship(back_populates="files")


class Alias(Base):
    """A movable name for one version, e.g. support-bot:prod. Every move is recorded in
    alias_history (see aliases.py)."""

    __tablename__ = "aliases"
    __table_args__ = (
        UniqueConstraint("adapter_id", "name"),
        ForeignKeyConstraint(["adapter_id", "version_id"], ["adapter_versions.adapter_id", "adapter_versions.id"]),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    adapter_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    version_id: Mapped[uuid.UUID]
    updated_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    adapter: Mapped[Adapter] = relationship(back_populates="aliases")
    # Joined on version_id alone: the composite key's adapter_id is owned by `adapter`.
    version: Mapped[AdapterVersion] = relationship(
        primaryjoin="Alias.version_id == AdapterVersion.id", foreign_keys="Alias.version_id"
    )


class AliasHistory(Base):
    """Which version an alias pointed at, when, and who moved it. Rows are only ever added;
    a version never disappears from under its history (no ON DELETE on the version keys)."""

    __tablename__ = "alias_history"
    __table_args__ = (Index(None, "adapter_id", "alias_name", "id"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)  # increasing: orders the moves
    adapter_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"))
    alias_name: Mapped[str] = mapped_column(String(64))
    from_version_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("adapter_versions.id"))  # None: created
    to_version_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("adapter_versions.id"))  # None: deleted
    changed_by_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    changed_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsageRecord(Base):
    """Tokens metered for one inference request."""

    __tablename__ = "usage_records"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    tenant_id: Mapped[uuid.UUID]
    api_key_id: Mapped[uuid.UUID | None]
    adapter_version_id: Mapped[uuid.UUID | None]  # None: the base model, a checkpoint or a server-local adapter
    # The engine's runtime adapter key (tenant and content digest), for operators; never shown to users.
    adapter_key: Mapped[str | None] = mapped_column(String(256))
    # The adapter as the tenant knows it (what /v1/usage groups by); all None: the base model.
    adapter_name: Mapped[str | None] = mapped_column(String(128))  # registry name, checkpoint id or local name
    adapter_version: Mapped[int | None]  # registry versions only
    adapter_alias: Mapped[str | None] = mapped_column(String(64))  # the alias followed; None for name@N
    model: Mapped[str] = mapped_column(String(256))  # what the client asked for, e.g. "support-bot:prod"
    request_id: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(32))  # "chat.completions" | "completions"
    # The request's OpenAI `metadata` (at most 16 string pairs), kept for the tenant's own bookkeeping.
    request_metadata: Mapped[dict[str, Any] | None]
    # The defaults match what migration 0002 gave rows metered before it (outcome and time unknown).
    status: Mapped[UsageStatus] = mapped_column(_enum_column(UsageStatus, "usage_status"), default=UsageStatus.ok)
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]
    cached_tokens: Mapped[int] = mapped_column(default=0)
    time_to_first_token_ms: Mapped[float | None] = mapped_column(Double)  # None: no token was generated
    duration_ms: Mapped[float] = mapped_column(Double, default=0.0)  # request received -> its end
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditLogEntry(Base):
    """One mutating API call: who did what to which resource, and whether it succeeded."""

    __tablename__ = "audit_log"
    __table_args__ = (Index(None, "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    tenant_id: Mapped[uuid.UUID | None]  # None: a server-wide action (e.g. creating a tenant)
    actor_key_id: Mapped[uuid.UUID | None]
    action: Mapped[str] = mapped_column(String(64))  # e.g. "adapter.create", "alias.move"
    resource_type: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(64))
    status_code: Mapped[int]
    client_ip: Mapped[str | None] = mapped_column(String(45))  # fits an IPv6 address
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FineTuningJobStatus(str, enum.Enum):
    """OpenAI's statuses, plus cancel_requested: the worker has been asked to stop and has not yet."""

    validating_files = "validating_files"
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancel_requested = "cancel_requested"
    cancelled = "cancelled"

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
    format: Mapped[str] = mapped_column(String(16))  # chat | instruction | text
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
        _enum_column(FineTuningJobStatus, "fine_tuning_job_status"), default=FineTuningJobStatus.queued
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


MUTABLE_VERSION_COLUMNS = frozenset({"status", "status_detail"})


@event.listens_for(AdapterVersion, "before_update")
@event.listens_for(AdapterVersionFile, "before_update")
def _refuse_changes_to_immutable_columns(mapper: Mapper[Any], connection: Any, target: Base) -> None:
    # Served weights are identified by version id everywhere (engine keys, prefix-cache
    # hashes, usage): if a version's content could change, all of those would silently lie.
    state = inspect(target)
    changed = [
        attr.key
        for attr in mapper.column_attrs
        if attr.key not in MUTABLE_VERSION_COLUMNS and state.attrs[attr.key].history.has_changes()
    ]
    if changed:
        raise ValueError(
            f"{type(target).__name__}: {', '.join(changed)} cannot change after it is written; register a new version"
        )


class BlobLock(Base):
    """One row per blob that was ever claimed or collected: the row both take a lock on, so that
    "is this blob referenced? then delete it" (collection) and "this blob is about to be referenced"
    (a claim) never interleave. Rows stay: deleting a lock row would let a waiter lock nothing."""

    __tablename__ = "blob_locks"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)


class BlobClaim(Base):
    """A blob some operation is storing and will reference once it commits (an upload being
    registered, a training file, a checkpoint): collection keeps the blob meanwhile. Claims are
    released when the operation ends; one left by a killed process stops counting after
    blob_references.CLAIM_TTL."""

    __tablename__ = "blob_claims"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# The limits both a tenant and a key may have.
PER_MINUTE_AND_CONCURRENT = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")


def _at_least_one(*columns: str) -> tuple[CheckConstraint, ...]:
    return tuple(CheckConstraint(f"{column} >= 1", name=column) for column in columns)


class TenantLimits(Base):
    """What an operator allows a tenant (platform/limits/). A column left None is unlimited; a tenant
    without a row is unlimited and has weight 1."""

    __tablename__ = "tenant_limits"
    __table_args__ = (
        *_at_least_one(*PER_MINUTE_AND_CONCURRENT, "max_training_jobs", "monthly_tokens"),
        CheckConstraint("share_weight > 0", name="share_weight"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_requests: Mapped[int | None]
    max_training_jobs: Mapped[int | None]  # jobs running at once; the rest wait queued
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger)  # input + output tokens per UTC month
    share_weight: Mapped[float] = mapped_column(Double, default=1.0)  # the engine's fair share (VTC)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ApiKeyLimits(Base):
    """Limits of one API key, on top of its tenant's: a request must fit both."""

    __tablename__ = "api_key_limits"
    __table_args__ = _at_least_one(*PER_MINUTE_AND_CONCURRENT)

    api_key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_requests: Mapped[int | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
