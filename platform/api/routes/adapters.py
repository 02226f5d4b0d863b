"""The adapter registry over HTTP: /v1/adapters, their versions, aliases (one version, or split between
versions by weight, then promoted or rolled back) and alias history.

Everything is scoped to the caller's tenant; another tenant's adapter is a 404 exactly
like a missing one. Reading and changing need a developer or admin key (an inference key
calls adapters by name and lists them in GET /v1/models, nothing more: docs/ACCESS.md).
Changes go through the registry service (registry/service.py), which forgets its cached
resolutions of the adapter; an alias move also prefetches its version into the engine's host
cache, and a deletion unloads the version from the engine before its blobs are removed.
"""
from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, File, Form, Query, Response, UploadFile
from sqlalchemy.orm import Session

from loraloom.engine import AdapterHandle, AdapterLoadError, EngineClient
from loraloom.platform.api.deps import DeveloperDep, EngineDep, RegistryDep, SessionDep
from loraloom.platform.api.schemas.adapters import (
    ALLOW_BASE_MISMATCH_IGNORED,
    AdapterList,
    AdapterNamePath,
    AdapterObject,
    AliasHistoryEntry,
    AliasHistoryList,
    AliasMoveBody,
    AliasNamePath,
    AliasObject,
    AliasPromoteBody,
    MovableAliasPath,
    Deleted,
    PresignedFileObject,
    UploadCompleteBody,
    UploadObject,
    UploadRequestBody,
    VersionList,
    VersionNumber,
    VersionObject,
)
from loraloom.platform.api.schemas.common import DEFAULT_PAGE_SIZE, ErrorResponse, PageLimit
from loraloom.platform.db.models import MAX_INT64, AdapterVersion
from loraloom.platform.registry.aliases import alias_history, find_alias
from loraloom.platform.registry.publish import Published
from loraloom.platform.registry.staging import UploadedPart
from loraloom.platform.registry.uploads import PlannedFile, UploadedFile
from loraloom.platform.registry.versions import (
    find_adapter,
    find_version,
    list_adapters,
    list_versions,
    version_aliases,
)

logger = logging.getLogger(__name__)


router = APIRouter(
    tags=["adapters"],
    responses={status: {"model": ErrorResponse} for status in (400, 404, 409, 413, 500)},
)


# ------------------------------------------------------------------ helpers
def _version_object(session: Session, version: AdapterVersion, adapter_name: str) -> VersionObject:
    return VersionObject.of(version, adapter_name, version_aliases(session, version=version))


# A push of content a version already holds answers 200 with that version, not 201.
DEDUPLICATED_RESPONSE = {200: {"model": VersionObject, "description": "The same files were pushed before: the "
                               "existing version, `deduplicated: true`; nothing was created."}}


def _published_object(session: Session, published: Published, adapter_name: str, response: Response) -> VersionObject:
    if published.deduplicated:
        response.status_code = 200
    answer = _version_object(session, published.version, adapter_name)
    answer.deduplicated = published.deduplicated
    return answer


async def _prefetch(engine: EngineClient, adapter: AdapterHandle) -> None:
    """Load a just-promoted version into the host cache, so its first request does not wait for storage."""
    try:
        await engine.load_adapter(adapter)
    except AdapterLoadError as error:
        logger.error("prefetch of %s failed: %s", adapter.key, error)


# ------------------------------------------------------------------ adapters
@router.get("/v1/adapters", response_model=AdapterList)
def get_adapters(
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last name of the previous page.")] = None,
) -> AdapterList:
    page = list_adapters(session, tenant_id=caller.tenant_id, limit=limit, after=after)
    return AdapterList.of(page, AdapterObject.of)


@router.get("/v1/adapters/{name}", response_model=AdapterObject)
def get_adapter(name: AdapterNamePath, caller: DeveloperDep, session: SessionDep, registry: RegistryDep) -> AdapterObject:
    return AdapterObject.of(find_adapter(session, tenant_id=caller.tenant_id, name=name))


@router.delete("/v1/adapters/{name}", response_model=Deleted)
def remove_adapter(
    name: AdapterNamePath,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    force: Annotated[bool, Query(description="Delete even while aliases other than latest point at its versions.")] = False,
) -> Deleted:
    """Delete an adapter and all its versions; refused (409) while it has aliases other than `latest`, unless force."""
    registry.delete_adapter(session, tenant_id=caller.tenant_id, name=name, force=force, unload=engine.unload_adapter)
    return Deleted(id=name, object="adapter")


# ------------------------------------------------------------------ versions
@router.post("/v1/adapters/{name}/versions", response_model=VersionObject, status_code=201,
             responses=DEDUPLICATED_RESPONSE)
def post_version(
    name: AdapterNamePath,
    response: Response,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    files: Annotated[
        list[UploadFile],
        File(description="adapter_config.json and adapter_model.safetensors, or one .tar.gz/.tgz/.tar/.zip of them."),
    ],
    # Accepted so that older clients keep working; it changes nothing (ALLOW_BASE_MISMATCH_IGNORED).
    allow_base_mismatch: Annotated[bool, Form(description=ALLOW_BASE_MISMATCH_IGNORED)] = False,
) -> VersionObject:
    """Upload a new version; the adapter is created by its first version. `latest` moves to it. Files a
    version already holds (byte for byte) return that version with status 200 and `deduplicated: true`."""
    published = registry.upload_version(
        session, tenant_id=caller.tenant_id, name=name, actor_key_id=caller.api_key_id,
        parts=[UploadedPart(filename=file.filename or "", stream=file.file) for file in files],
    )
    return _published_object(session, published, name, response)


@router.get("/v1/adapters/{name}/versions", response_model=VersionList)
def get_versions(
    name: AdapterNamePath,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_INT64, description="The last version number of the previous page.")
    ] = None,
) -> VersionList:
    page = list_versions(session, tenant_id=caller.tenant_id, name=name, limit=limit, after=after)
    return VersionList.of(page, lambda version: _version_object(session, version, name))


@router.get("/v1/adapters/{name}/versions/{number}", response_model=VersionObject)
def get_version(
    name: AdapterNamePath, number: VersionNumber, caller: DeveloperDep, session: SessionDep, registry: RegistryDep
) -> VersionObject:
    return _version_object(session, find_version(session, tenant_id=caller.tenant_id, name=name, number=number), name)


@router.delete("/v1/adapters/{name}/versions/{number}", response_model=Deleted)
def remove_version(
    name: AdapterNamePath,
    number: VersionNumber,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    force: Annotated[bool, Query(description="Also delete the aliases (other than latest) pointing at it.")] = False,
) -> Deleted:
    registry.delete_version(
        session, tenant_id=caller.tenant_id, name=name, number=number, force=force, actor_key_id=caller.api_key_id,
        unload=engine.unload_adapter,
    )
    return Deleted(id=f"{name}@{number}", object="adapter.version")


# ------------------------------------------------------------------ presigned uploads
@router.post("/v1/adapters/{name}/uploads", response_model=UploadObject)
def post_upload(
    name: AdapterNamePath, body: UploadRequestBody, caller: DeveloperDep, registry: RegistryDep
) -> UploadObject:
    """For adapters too big to pass through the gateway: presigned URLs to PUT the files straight to object
    storage (S3 storage only): the two PEFT files, and the adapter's own chat template if it has one
    (chat_template.jinja, or tokenizer_config.json's); then POST .../uploads/complete."""
    presigned = registry.request_presigned_uploads(
        name=name, files=[PlannedFile(filename=file.filename, size_bytes=file.size_bytes) for file in body.files]
    )
    return UploadObject(
        files=[
            PresignedFileObject(
                filename=p.filename, upload_key=p.upload_key, url=p.url, headers=p.headers, expires_at=p.expires_at
            )
            for p in presigned
        ]
    )


@router.post("/v1/adapters/{name}/uploads/complete", response_model=VersionObject, status_code=201,
             responses=DEDUPLICATED_RESPONSE)
def post_upload_complete(
    name: AdapterNamePath,
    body: UploadCompleteBody,
    response: Response,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
) -> VersionObject:
    """Verify the uploaded files' sizes and sha256, validate the adapter, register the new version (or
    return, with status 200, the version that holds the same files already)."""
    published = registry.complete_presigned_upload(
        session, tenant_id=caller.tenant_id, name=name, actor_key_id=caller.api_key_id,
        files=[
            UploadedFile(filename=f.filename, upload_key=f.upload_key, sha256=f.sha256, size_bytes=f.size_bytes)
            for f in body.files
        ],
    )
    return _published_object(session, published, name, response)


# ------------------------------------------------------------------ aliases
@router.get("/v1/adapters/{name}/aliases/{alias}", response_model=AliasObject)
def get_alias(name: AdapterNamePath, alias: AliasNamePath, caller: DeveloperDep, session: SessionDep, registry: RegistryDep) -> AliasObject:
    return AliasObject.of(find_alias(session, tenant_id=caller.tenant_id, name=name, alias=alias), name)


@router.put("/v1/adapters/{name}/aliases/{alias}", response_model=AliasObject)
def put_alias(
    name: AdapterNamePath,
    alias: MovableAliasPath,
    body: AliasMoveBody,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    background: BackgroundTasks,
) -> AliasObject:
    """Point the alias at a version (`version`), or split its requests between versions by weight (`split`: a
    canary rollout; then promote or roll back); recorded in the alias's history. The versions are prefetched
    into the engine's host cache after the response."""
    shares = body.shares()
    if shares is None:
        assert body.version is not None  # shares() refuses a body with neither
        row, version = registry.move_alias(
            session, tenant_id=caller.tenant_id, name=name, alias=alias, number=body.version,
            actor_key_id=caller.api_key_id,
        )
        handles = [version]
    else:
        row, handles = registry.split_alias(
            session, tenant_id=caller.tenant_id, name=name, alias=alias, shares=shares, actor_key_id=caller.api_key_id,
        )
    for handle in handles:
        background.add_task(_prefetch, engine, handle)
    return AliasObject.of(row, name)


@router.post("/v1/adapters/{name}/aliases/{alias}/promote", response_model=AliasObject)
def promote_alias_route(
    name: AdapterNamePath,
    alias: MovableAliasPath,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    background: BackgroundTasks,
    body: AliasPromoteBody | None = None,
) -> AliasObject:
    """End the alias's split on one of its versions: `version`, by default the split's newest (the canary).
    409 when the alias is not split. Recorded in the alias's history."""
    row, version = registry.promote_alias(
        session, tenant_id=caller.tenant_id, name=name, alias=alias, number=None if body is None else body.version,
        actor_key_id=caller.api_key_id,
    )
    background.add_task(_prefetch, engine, version)
    return AliasObject.of(row, name)


@router.post("/v1/adapters/{name}/aliases/{alias}/rollback", response_model=AliasObject)
def rollback_alias_route(
    name: AdapterNamePath,
    alias: MovableAliasPath,
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    background: BackgroundTasks,
) -> AliasObject:
    """End the alias's split on the version the alias named before the split. 409 when the alias is not split,
    or was created split. Recorded in the alias's history."""
    row, version = registry.rollback_alias(
        session, tenant_id=caller.tenant_id, name=name, alias=alias, actor_key_id=caller.api_key_id
    )
    background.add_task(_prefetch, engine, version)
    return AliasObject.of(row, name)


@router.delete("/v1/adapters/{name}/aliases/{alias}", response_model=Deleted)
def delete_alias_route(
    name: AdapterNamePath, alias: MovableAliasPath, caller: DeveloperDep, session: SessionDep, registry: RegistryDep
) -> Deleted:
    registry.remove_alias(session, tenant_id=caller.tenant_id, name=name, alias=alias, actor_key_id=caller.api_key_id)
    return Deleted(id=f"{name}:{alias}", object="adapter.alias")


@router.get("/v1/adapters/{name}/aliases/{alias}/history", response_model=AliasHistoryList)
def get_alias_history(
    name: AdapterNamePath, alias: AliasNamePath, caller: DeveloperDep, session: SessionDep, registry: RegistryDep
) -> AliasHistoryList:
    moves = alias_history(session, tenant_id=caller.tenant_id, name=name, alias=alias)
    return AliasHistoryList(data=[AliasHistoryEntry.of(move) for move in moves])
