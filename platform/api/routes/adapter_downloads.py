"""Getting an adapter version back: its PEFT directory as one .tar.gz, each file on its own, and
where to fetch them (presigned object-storage URLs where the store offers them).

The weights leave the server as they were stored, byte for byte; the config names the served
base model (registry/export.py). Another tenant's version is a 404 exactly like a missing one.
Downloading needs a developer or admin key, as pushing does: an inference key calls an adapter
but cannot take its weights away.
"""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import StreamingResponse

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.api.deps import DeveloperDep, EngineDep, RegistryDep, SessionDep
from loraloom.platform.api.schemas.adapter_downloads import DownloadFileObject, DownloadObject
from loraloom.platform.api.schemas.adapters import AdapterNamePath, VersionNumber
from loraloom.platform.api.schemas.common import ErrorResponse
from loraloom.platform.registry.archive import ArchiveMember, tar_gz
from loraloom.platform.registry.export import ExportedVersion, export_version
from loraloom.platform.storage import BlobStore, read_chunks

router = APIRouter(
    tags=["adapters"],
    responses={status: {"model": ErrorResponse} for status in (400, 403, 404, 409, 500)},
)

FileName = Annotated[
    Literal["adapter_config.json", "adapter_model.safetensors", "chat_template.jinja"],
    Path(description="Which of the version's files (chat_template.jinja only for an adapter with its own template)."),
]
TAR_GZ = "application/gzip"
OCTET_STREAM = "application/octet-stream"
MEDIA_TYPES = {ADAPTER_CONFIG_FILE: "application/json", ADAPTER_WEIGHTS_FILE: OCTET_STREAM,
               "chat_template.jinja": "text/plain; charset=utf-8"}


def _binary(media_type: str, description: str) -> dict:
    """The OpenAPI entry of a 200 whose body is a file, not JSON."""
    schema = {"type": "string", "format": "binary"}
    return {200: {"description": description, "content": {media_type: {"schema": schema}}}}


def _attachment(filename: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{filename}"'}


def _export(
    name: AdapterNamePath, number: VersionNumber, caller: DeveloperDep, session: SessionDep, registry: RegistryDep,
    engine: EngineDep,
) -> ExportedVersion:
    """The version the path names, as the caller's tenant sees it, with the served base's name."""
    return export_version(
        session,
        store=registry.store,
        tenant_id=caller.tenant_id,
        name=name,
        number=number,
        served_base=engine.model_name,
    )


# Every route here takes {name} and {number} through this one dependency (and the key check with it).
ExportDep = Annotated[ExportedVersion, Depends(_export)]


def _members(exported: ExportedVersion, store: BlobStore) -> list[ArchiveMember]:
    """Every file opened now: a missing blob is an error response, not an archive cut short."""
    opened: list[ArchiveMember] = []
    try:
        for file in exported.files:
            stream = file.open(store)
            opened.append(ArchiveMember(file.filename, file.size_bytes, stream, exported.created_at.timestamp()))
    except BaseException:
        for member in opened:
            member.stream.close()
        raise
    return opened


@router.get(
    "/v1/adapters/{name}/versions/{number}/content",
    response_class=StreamingResponse,
    responses=_binary(TAR_GZ, "adapter_config.json and adapter_model.safetensors at the archive's top level."),
)
def get_version_content(exported: ExportDep, registry: RegistryDep) -> StreamingResponse:
    """The version as a PEFT directory in a .tar.gz, streamed: extract it into a folder and
    `peft.PeftModel.from_pretrained(base, folder)` loads it."""
    members = _members(exported, registry.store)
    return StreamingResponse(
        tar_gz(members), media_type=TAR_GZ, headers=_attachment(f"{exported.reference}.tar.gz")
    )


@router.get(
    "/v1/adapters/{name}/versions/{number}/files/{filename}",
    response_class=StreamingResponse,
    responses=_binary(OCTET_STREAM, "The file's bytes; their sha256 is the one GET .../download lists."),
)
def get_version_file(exported: ExportDep, filename: FileName, registry: RegistryDep) -> StreamingResponse:
    """One file of the version, streamed through the gateway."""
    file = exported.file(filename)
    return StreamingResponse(
        read_chunks(file.open(registry.store)),
        media_type=MEDIA_TYPES[filename],
        headers={**_attachment(filename), "Content-Length": str(file.size_bytes)},
    )


@router.get("/v1/adapters/{name}/versions/{number}/download", response_model=DownloadObject)
def get_version_download(exported: ExportDep, request: Request, registry: RegistryDep) -> DownloadObject:
    """Where to fetch each file of the version, with its size and sha256. On S3 storage the weights'
    URL is presigned, straight to the bucket (it expires at `expires_at`); the config, which names
    the served base, and everything on file:// storage come through this API's .../files/ route."""
    store, expires_s = registry.store, registry.presigned_expires_s
    files = []
    for file in exported.files:
        presigned = (
            store.presigned_get(file.blob_key, expires_s=expires_s, filename=file.filename)
            if file.blob_key is not None
            else None
        )
        files.append(
            DownloadFileObject(
                filename=file.filename,
                size_bytes=file.size_bytes,
                sha256=file.sha256,
                url=presigned.url
                if presigned is not None
                else request.app.url_path_for(
                    "get_version_file", name=exported.adapter_name, number=str(exported.number), filename=file.filename
                ),
                expires_at=presigned.expires_at if presigned is not None else None,
            )
        )
    return DownloadObject(adapter=exported.adapter_name, version=exported.number, files=files)
