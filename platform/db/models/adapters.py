"""The adapter registry: tenant -> adapters -> versions -> files; aliases point a name at one version
of the same adapter, or split its traffic between several by weight (alias_splits). Versions are
immutable once written (see _refuse_changes_to_immutable_columns); only their status moves
(pending -> ready | failed)."""
from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    String,
    Text,
    UniqueConstraint,
    event,
    inspect,
    text,
)
from sqlalchemy.orm import Mapped, Mapper, mapped_column, relationship

from loraloom.platform.db.models.base import Base, BigIntId, JSONDocument, enum_column, utcnow


MAX_DECLARED_BASE_CHARS = 1024  # a local training path can be long; a longer one is stored cut
MAX_TOOL_PARSER_CHARS = 32  # a format's name (settings.TOOL_PARSER_CHOICES), checked before it is stored


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
        enum_column(AdapterVersionStatus, "adapter_version_status"), default=AdapterVersionStatus.pending
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
    # The tool-call format adapter_config.json's `tool_parser` names (registry/tool_parsers.py); None: it names none.
    tool_parser: Mapped[str | None] = mapped_column(String(MAX_TOOL_PARSER_CHARS))
    source: Mapped[AdapterVersionSource] = mapped_column(enum_column(AdapterVersionSource, "adapter_version_source"))
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


class AliasAction(str, enum.Enum):
    """What a change of an alias did, as its history shows it."""

    set = "set"  # pointed at one version (created, moved, `latest` following uploads)
    split = "split"  # split its traffic between versions by weight
    promote = "promote"  # a split became one of its versions
    rollback = "rollback"  # a split went back to the version the alias named before it
    delete = "delete"
    # A fine-tuning job's `promote` (training/promotion.py), training_job_id naming the job:
    job_promote = "job_promote"  # moved to the job's version unconditionally (`when`: always)
    gated_promote = "gated_promote"  # moved: the job's version had the lower validation loss, or nothing to compare
    gate_refused = "gate_refused"  # not moved (to_version is where it stays): its versions' loss was not beaten


class Alias(Base):
    """A movable name for one version, e.g. support-bot:prod. Every move is recorded in
    alias_history (see aliases.py). With rows in alias_splits the alias's requests are spread
    over those versions by weight; version_id is then the split's version with the largest weight,
    so that everything reading one version per alias still reads a meaningful one."""

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
    # Empty for an alias naming one version.
    split: Mapped[list[AliasSplit]] = relationship(
        order_by="AliasSplit.version_number", cascade="all, delete-orphan", passive_deletes=True
    )


class AliasSplit(Base):
    """One version of a split alias and its integer weight (its share is weight / the split's total)."""

    __tablename__ = "alias_splits"
    __table_args__ = (
        # As for aliases: a split may only name versions of its own adapter, enforced by the database.
        ForeignKeyConstraint(["adapter_id", "version_id"], ["adapter_versions.adapter_id", "adapter_versions.id"]),
        CheckConstraint("weight >= 1", name="weight_positive"),
    )

    alias_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("aliases.id", ondelete="CASCADE"), primary_key=True)
    version_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    adapter_id: Mapped[uuid.UUID]
    # Copied from the version (immutable, never reused): orders the split and names it without a join.
    version_number: Mapped[int]
    weight: Mapped[int]


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
    action: Mapped[AliasAction] = mapped_column(
        enum_column(AliasAction, "alias_action"), default=AliasAction.set
    )
    # The split this change set, as [{"version": N, "weight": W}, ...] by version; None: it set one version
    # (to_version_id) or deleted the alias. Numbers, not ids: a version's number is never reused.
    split: Mapped[list[dict[str, int]] | None] = mapped_column(JSONDocument)
    # The fine-tuning job whose `promote` made this change (a plain id: jobs may be purged); None otherwise.
    training_job_id: Mapped[str | None] = mapped_column(String(40))
    # An evaluation-gated promotion's comparison (training/promotion.py: the job's version, both validation
    # losses, each compared version's); None for every other change.
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument)


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
