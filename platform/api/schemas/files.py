"""/v1/files: training datasets, in OpenAI's file shapes."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from loraloom.platform.api.schemas.common import IdPageObject, unix_seconds
from loraloom.platform.db.models import TrainingFile


class FileObject(BaseModel):
    object: Literal["file"] = "file"
    id: str
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: str
    status: Literal["processed"] = Field(default="processed", description="Files are validated at upload.")
    status_details: None = None
    format: str = Field(description="chat, instruction or text (for supervised jobs), or preference (for DPO jobs).")
    line_count: int = Field(description="Examples in the file.")
    token_count: int = Field(description="Tokens of all examples with the served base's tokenizer.")

    @classmethod
    def of(cls, row: TrainingFile) -> FileObject:
        return cls(
            id=row.id, bytes=row.size_bytes, created_at=unix_seconds(row.created_at), filename=row.filename,
            purpose=row.purpose, format=row.format, line_count=row.line_count, token_count=row.token_count,
        )


class FileList(IdPageObject[FileObject]):
    pass


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: Literal[True] = True
