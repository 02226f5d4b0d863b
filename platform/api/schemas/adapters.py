"""The adapter registry's bodies: adapters, versions, aliases and their history, presigned uploads."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, Field

from loraloom.engine import RequestFieldError
from loraloom.platform.api.schemas.common import ListObject, PageObject, StrictBody, documented_pattern
from loraloom.platform.db.models import MAX_INT64, Adapter, AdapterVersion, Alias, AliasAction
from loraloom.platform.registry.aliases import AliasMove, alias_split
from loraloom.platform.registry.references import ADAPTER_NAME_PATTERN, ALIAS_NAME_PATTERN, LATEST_ALIAS
from loraloom.platform.registry.splits import MAX_SPLIT_VERSIONS, MAX_SPLIT_WEIGHT, MIN_SPLIT_VERSIONS, Share
from loraloom.platform.registry.validation import base_model_warning
from loraloom.platform.settings import ToolParserName

# A version number in a path: past 64 bits it is a 400 naming `number`, not a database overflow.
VersionNumber = Annotated[int, Path(ge=1, le=MAX_INT64, description="The version number (name@N).")]
# Names in a path: the registry checks them (and says what is wrong); the document states the same rule.
AdapterNamePath = Annotated[str, Path(description="The adapter's name.",
                                      json_schema_extra=documented_pattern(ADAPTER_NAME_PATTERN))]
AliasNamePath = Annotated[str, Path(description="The alias' name.", json_schema_extra=documented_pattern(ALIAS_NAME_PATTERN))]
# An alias a caller moves or deletes: any but `latest`, which always names the newest version.
MovableAliasPath = Annotated[str, Path(description="The alias' name; not latest, which moves by itself.",
                                       json_schema_extra={**documented_pattern(ALIAS_NAME_PATTERN),
                                                          "not": {"const": LATEST_ALIAS}})]


# ------------------------------------------------------------------ bodies
class VersionFile(BaseModel):
    filename: str
    sha256: str
    size_bytes: int


# An adapter is judged by its modules and shapes, not by the base name its config declares (registry/validation.py),
# so the override older clients send has nothing left to override.
ALLOW_BASE_MISMATCH_IGNORED = (
    "Accepted and ignored: no override is needed. An adapter is accepted when its modules and shapes fit the served "
    "base; a different base_model_name_or_path is recorded as the version's base_model_warning."
)

class VersionObject(BaseModel):
    object: Literal["adapter.version"] = "adapter.version"
    id: uuid.UUID
    adapter: str
    version: int
    status: str
    base_model: str
    declared_base_model: str | None = Field(description="The base model adapter_config.json names "
                                            "(base_model_name_or_path), as uploaded; null if it names none.")
    base_model_warning: str | None = Field(description="Set when declared_base_model names another model than "
                                           "base_model: the adapter was accepted because its modules and shapes fit.")
    rank: int
    alpha: float
    target_modules: list[str]
    dtype: str
    source: str
    training_job_id: str | None
    files: list[VersionFile]
    chat_template: bool = Field(
        default=False, description="Whether the version brought its own chat template (chat_template.jinja among "
        "its files, downloadable from .../files/chat_template.jinja): chat requests to it render with that template.",
    )
    tool_parser: ToolParserName | None = Field(
        default=None, description="The tool-call format the version's adapter_config.json names (its `tool_parser` "
        "field); chat requests to it parse and constrain calls in that format (auto: the one its chat template "
        "shows). null: it names none, and calls take the format of its own chat template, else the server's.",
    )
    aliases: list[str] = Field(description="The aliases pointing at this version now.")
    created_at: datetime
    created_by_key_id: uuid.UUID | None
    deduplicated: bool = Field(
        default=False,
        description="On a push: true when a ready version of the adapter already held the same two files byte "
        "for byte; that version is returned (status 200, not 201) and nothing was created, stored or moved.",
    )

    @classmethod
    def of(cls, version: AdapterVersion, adapter_name: str, aliases: list[str]) -> VersionObject:
        return cls(
            id=version.id,
            adapter=adapter_name,
            version=version.number,
            status=version.status.value,
            base_model=version.base_model,
            declared_base_model=version.declared_base_model,
            base_model_warning=base_model_warning(version.declared_base_model, version.base_model),
            rank=version.rank,
            alpha=version.alpha,
            target_modules=list(version.target_modules),
            dtype=version.dtype,
            source=version.source.value,
            training_job_id=version.training_job_id,
            files=[VersionFile(filename=f.filename, sha256=f.sha256, size_bytes=f.size_bytes) for f in version.files],
            chat_template=any(f.filename == "chat_template.jinja" for f in version.files),
            tool_parser=version.tool_parser,
            aliases=sorted(aliases),
            created_at=version.created_at,
            created_by_key_id=version.created_by_key_id,
        )


class VersionList(PageObject[VersionObject]):
    pass


class LatestVersionSummary(BaseModel):
    """What a listing shows of an adapter's `latest` version, so a client can sort adapters by
    rank, modules or size without one request per adapter."""

    version: int
    rank: int
    alpha: float
    target_modules: list[str]
    size_bytes: int = Field(description="The version's files together, in bytes.")

    @classmethod
    def of(cls, version: AdapterVersion) -> LatestVersionSummary:
        return cls(
            version=version.number,
            rank=version.rank,
            alpha=version.alpha,
            target_modules=list(version.target_modules),
            size_bytes=sum(file.size_bytes for file in version.files),
        )


class AdapterObject(BaseModel):
    object: Literal["adapter"] = "adapter"
    id: uuid.UUID
    name: str
    description: str
    tags: list[str]
    aliases: dict[str, int] = Field(description="Alias -> version number, `latest` included (a split alias: its "
                                    "version with the largest weight; GET .../aliases/{alias} shows the split).")
    latest_version: LatestVersionSummary | None = Field(
        description="The version `latest` points at (rank, alpha, target modules, size); null while the adapter "
        "has no ready version."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, adapter: Adapter) -> AdapterObject:
        latest = next((alias.version for alias in adapter.aliases if alias.name == LATEST_ALIAS), None)
        return cls(
            id=adapter.id,
            name=adapter.name,
            description=adapter.description,
            tags=list(adapter.tags),
            aliases={alias.name: alias.version.number for alias in adapter.aliases},
            latest_version=LatestVersionSummary.of(latest) if latest is not None else None,
            created_at=adapter.created_at,
            updated_at=adapter.updated_at,
        )


class AdapterList(PageObject[AdapterObject]):
    last_id: str | None = Field(description="The last adapter's name: pass it as `after` for the next page.")

    @classmethod
    def cursors(cls, data: list[AdapterObject]) -> dict[str, Any]:
        return {"last_id": data[-1].name if data else None}


class Deleted(BaseModel):
    id: str
    object: str
    deleted: Literal[True] = True


class SplitShareBody(StrictBody):
    version: int = Field(ge=1, le=MAX_INT64, description="A version of the adapter (name@N).")
    weight: int = Field(ge=1, le=MAX_SPLIT_WEIGHT, description="Its share of the requests is weight / the split's "
                        "total weight (90 and 10: 90% and 10%).")


SPLIT_DESCRIPTION = (
    f"Split the alias's requests between {MIN_SPLIT_VERSIONS} to {MAX_SPLIT_VERSIONS} distinct versions by weight "
    "(a canary rollout). A request with `user` gets the same version every time while the split stays the same "
    "(a hash of tenant, alias and user; changing a weight moves only the users it must); one without draws per "
    "request. Not for `latest`."
)


class AliasMoveBody(StrictBody):
    """Either `version` (point the alias at one version) or `split` (spread it over versions by weight)."""

    version: int | None = Field(default=None, ge=1, le=MAX_INT64, description="The version number the alias should "
                                "point at (its split, if it had one, ends).")
    split: list[SplitShareBody] | None = Field(default=None, min_length=MIN_SPLIT_VERSIONS,
                                               max_length=MAX_SPLIT_VERSIONS, description=SPLIT_DESCRIPTION)

    def shares(self) -> list[Share] | None:
        """The split asked for, or None for one version; refuses a body with both or neither."""
        if (self.version is None) == (self.split is None):
            field = "split" if self.split is not None else "version"
            raise RequestFieldError(field, 'send either {"version": N} or {"split": [{"version": N, "weight": W}, '
                                    "...]}, " + ("not both" if self.split is not None else "one of them"))
        return None if self.split is None else [Share(share.version, share.weight) for share in self.split]


class AliasPromoteBody(StrictBody):
    version: int | None = Field(default=None, ge=1, le=MAX_INT64, description="The split's version the alias should "
                                "name from now on; by default its newest (the canary).")


class SplitShareObject(BaseModel):
    version: int
    weight: int


def _share_objects(shares: tuple[Share, ...] | None) -> list[SplitShareObject] | None:
    return None if shares is None else [SplitShareObject(version=s.version, weight=s.weight) for s in shares]


class AliasObject(BaseModel):
    object: Literal["adapter.alias"] = "adapter.alias"
    adapter: str
    alias: str
    version: int = Field(description="The version the alias names; while it is split, the split's version with the "
                         "largest weight (the older on a tie).")
    split: list[SplitShareObject] | None = Field(
        default=None, description="The versions the alias's requests are split between, by version, with their "
        "weights; null while it names one version."
    )
    updated_at: datetime
    updated_by_key_id: uuid.UUID | None

    @classmethod
    def of(cls, alias: Alias, adapter_name: str) -> AliasObject:
        return cls(
            adapter=adapter_name,
            alias=alias.name,
            version=alias.version.number,
            split=_share_objects(alias_split(alias)),
            updated_at=alias.updated_at,
            updated_by_key_id=alias.updated_by_key_id,
        )


class ComparedVersionObject(BaseModel):
    version: int
    valid_loss: float


class PromotionGateObject(BaseModel):
    """An evaluation-gated promotion's comparison, on the job's validation file with the job's own loss."""

    new_version: int = Field(description="The job's version, which the gate moved the alias to or refused.")
    new_valid_loss: float = Field(description="The job's version's validation loss (its full_valid_loss).")
    current_valid_loss: float | None = Field(
        description="The lowest validation loss of the versions the alias named (each version of a split); null "
        "when the alias did not exist, and the job's version created it.")
    compared: list[ComparedVersionObject] = Field(description="Each version the alias named, with its loss.")


class AliasHistoryEntry(BaseModel):
    object: Literal["adapter.alias.move"] = "adapter.alias.move"
    action: AliasAction = Field(description="What the change did: `set` (one version), `split`, `promote` (a split "
                                "became one of its versions), `rollback` (a split went back to the version before "
                                "it), `delete`; a fine-tuning job's `promote`: `job_promote` (moved without a gate), "
                                "`gated_promote` (moved: its version's validation loss was lower, or nothing to "
                                "compare), `gate_refused` (not moved: to_version and split are what it still names).")
    from_version: int | None = Field(description="None: the alias was created by this move.")
    to_version: int | None = Field(description="None: the alias was deleted by this move. For a split, its version "
                                   "with the largest weight.")
    split: list[SplitShareObject] | None = Field(default=None, description="The split this change set; null otherwise.")
    changed_at: datetime
    changed_by_key_id: uuid.UUID | None
    training_job_id: str | None = Field(default=None, description="The fine-tuning job whose promotion this is.")
    gate: PromotionGateObject | None = Field(default=None, description="A gated promotion's comparison; null "
                                             "otherwise.")

    @classmethod
    def of(cls, move: AliasMove) -> AliasHistoryEntry:
        return cls(action=move.action, from_version=move.from_version, to_version=move.to_version,
                   split=_share_objects(move.split), changed_at=move.changed_at,
                   changed_by_key_id=move.changed_by_key_id, training_job_id=move.training_job_id,
                   gate=None if move.gate is None else PromotionGateObject.model_validate(move.gate))


class AliasHistoryList(ListObject[AliasHistoryEntry]):
    pass


class PlannedFileBody(StrictBody):
    filename: str
    size_bytes: int = Field(ge=0, le=MAX_INT64)


class UploadRequestBody(StrictBody):
    files: list[PlannedFileBody] = Field(description="adapter_config.json and adapter_model.safetensors, with sizes "
                                         "(and, for an adapter with its own chat template, chat_template.jinja or "
                                         "tokenizer_config.json with a chat_template, as a direct upload takes them).")


class PresignedFileObject(BaseModel):
    filename: str
    upload_key: str = Field(description="Pass back to .../uploads/complete.")
    url: str = Field(description="PUT the file's bytes here, with exactly `headers`.")
    headers: dict[str, str]
    expires_at: datetime


class UploadObject(BaseModel):
    object: Literal["adapter.upload"] = "adapter.upload"
    files: list[PresignedFileObject]


class UploadedFileBody(StrictBody):
    filename: str
    upload_key: str
    sha256: str = Field(description="Hex digest of the bytes PUT to the URL; verified before registering.")
    size_bytes: int = Field(ge=0, le=MAX_INT64)


class UploadCompleteBody(StrictBody):
    files: list[UploadedFileBody]
    allow_base_mismatch: bool = Field(default=False, description=ALLOW_BASE_MISMATCH_IGNORED)
