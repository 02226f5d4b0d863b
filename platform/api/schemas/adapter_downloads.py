"""Downloads of an adapter version: where each of its files can be fetched."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class DownloadFileObject(BaseModel):
    filename: str
    size_bytes: int
    sha256: str = Field(
        description="Hex digest of the bytes the URL gives: the stored weights' own; for adapter_config.json, "
        "that of the exported config (which names the served base model)."
    )
    url: str = Field(
        description="An absolute presigned URL straight to object storage (send no Authorization header), "
        "or a path on this API (send your API key)."
    )
    expires_at: datetime | None = Field(description="When a presigned URL stops working; None for an API path.")


class DownloadObject(BaseModel):
    object: Literal["adapter.version.download"] = "adapter.version.download"
    adapter: str
    version: int
    files: list[DownloadFileObject] = Field(
        description="adapter_config.json and adapter_model.safetensors: save both in one folder, "
        "which peft.PeftModel.from_pretrained loads."
    )
