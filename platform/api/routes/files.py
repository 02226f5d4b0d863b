"""/v1/files: training datasets, in OpenAI's shapes. Uploads are validated against the served
base's tokenizer and context length before anything is stored; a refused file gets a 400
whose `error.details.report` lists line numbers and reasons."""
from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from loraloom.platform.api.deps import DeveloperDep, EngineDep, RegistryDep, SessionDep, SettingsDep
from loraloom.platform.api.schemas.common import DEFAULT_PAGE_SIZE, ErrorResponse, PageLimit
from loraloom.platform.api.schemas.files import FileDeleted, FileList, FileObject
from loraloom.platform.storage import read_chunks
from loraloom.platform.training.files import create_file, delete_file, find_file, list_files, open_file

router = APIRouter(
    tags=["files"],
    responses={status: {"model": ErrorResponse} for status in (400, 404, 409, 413, 500)},
)


@router.post("/v1/files", response_model=FileObject)
def upload_file(
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    engine: EngineDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="A JSONL dataset: chat, instruction or text format (supervised), "
                                     "or preference pairs (DPO).")],
    purpose: Annotated[str, Form(description="fine-tune")],
) -> FileObject:
    row = create_file(
        session,
        store=registry.store,
        tenant_id=caller.tenant_id,
        actor_key_id=caller.api_key_id,
        filename=file.filename or "",
        purpose=purpose,
        stream=file.file,
        max_bytes=settings.training_file_max_bytes,
        tokenizer=engine.tokenizer,
        max_seq_len=engine.max_model_len,
    )
    return FileObject.of(row)


@router.get("/v1/files", response_model=FileList)
def get_files(
    caller: DeveloperDep,
    session: SessionDep,
    registry: RegistryDep,
    purpose: str | None = None,
    limit: PageLimit = DEFAULT_PAGE_SIZE,
    after: Annotated[str | None, Query(description="The last file id of the previous page.")] = None,
) -> FileList:
    page = list_files(session, tenant_id=caller.tenant_id, limit=limit, after=after, purpose=purpose)
    return FileList.of(page, FileObject.of)


@router.get("/v1/files/{file_id}", response_model=FileObject)
def get_file(file_id: str, caller: DeveloperDep, session: SessionDep, registry: RegistryDep) -> FileObject:
    return FileObject.of(find_file(session, tenant_id=caller.tenant_id, file_id=file_id))


@router.delete("/v1/files/{file_id}", response_model=FileDeleted)
def remove_file(file_id: str, caller: DeveloperDep, session: SessionDep, registry: RegistryDep) -> FileDeleted:
    delete_file(session, store=registry.store, tenant_id=caller.tenant_id, file_id=file_id)
    return FileDeleted(id=file_id)


@router.get("/v1/files/{file_id}/content", response_class=StreamingResponse)
def get_file_content(file_id: str, caller: DeveloperDep, session: SessionDep, registry: RegistryDep):
    row = find_file(session, tenant_id=caller.tenant_id, file_id=file_id)
    blob = open_file(registry.store, row)
    return StreamingResponse(
        iterate_in_threadpool(read_chunks(blob)), media_type="application/jsonl",
        # The name is the uploader's: percent-encoded, so it can never break out of the header.
        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(row.filename, safe='')}",
                 "Content-Length": str(row.size_bytes)},
    )
