"""What a download of an adapter version hands out: its two PEFT files, as a client should get them.

The weights go out as stored, byte for byte (their sha256 is the one the version lists). The
config is the one exception: `base_model_name_or_path` is rewritten to the base's served name,
what clients send as `model`. A trained adapter's stored config names the directory the worker
trained from (a path on the server, meaningless to the customer), and an uploaded one may name
the base under another spelling; either way the customer should get back a config that names
the model they call. Its sha256 is then that of the rewritten bytes.
"""
from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from typing import BinaryIO

from sqlalchemy.orm import Session

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_FILES, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db.models import AdapterVersionStatus
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.versions import find_version
from loraloom.platform.storage import BlobStore, content_key

BASE_MODEL_FIELD = "base_model_name_or_path"


@dataclass(frozen=True)
class ExportedFile:
    """One file of a download: either a stored blob exactly (`blob_key`: it can be presigned) or
    bytes made for the download (`data`)."""

    filename: str
    size_bytes: int
    sha256: str
    blob_key: str | None = None
    data: bytes | None = None

    def __post_init__(self) -> None:
        if (self.blob_key is None) == (self.data is None):
            raise ValueError("an exported file is either a stored blob or its own bytes, not both or neither")

    def open(self, store: BlobStore) -> BinaryIO:
        """Its bytes as a stream (close it). A stored blob is opened now, so a missing one fails here,
        before a response has started."""
        return io.BytesIO(self.data) if self.data is not None else store.open(self.blob_key or "")


@dataclass(frozen=True)
class ExportedVersion:
    adapter_name: str
    number: int
    created_at: datetime
    files: tuple[ExportedFile, ...]  # in ADAPTER_FILES order (the small config first), then its chat template

    @property
    def reference(self) -> str:
        return f"{self.adapter_name}@{self.number}"

    def file(self, filename: str) -> ExportedFile:
        for file in self.files:
            if file.filename == filename:
                return file
        raise RegistryNotFoundError(f"version {self.number} of {self.adapter_name!r} has no {filename}")


def export_version(
    session: Session, *, store: BlobStore, tenant_id: uuid.UUID, name: str, number: int, served_base: str
) -> ExportedVersion:
    """The files of version `number` of the tenant's adapter `name` (RegistryNotFoundError for
    another tenant's, exactly as for a missing one), the config naming `served_base`."""
    version = find_version(session, tenant_id=tenant_id, name=name, number=number)
    if version.status is not AdapterVersionStatus.ready:
        raise RegistryConflictError(
            f"version {number} of {name!r} is {version.status.value}, not ready: it has no files to download yet"
        )
    stored = {file.filename: file for file in version.files}
    config_sha256 = stored[ADAPTER_CONFIG_FILE].sha256
    with store.open(content_key(config_sha256)) as blob:
        config = config_naming_base(blob.read(), served_base)
    weights = stored[ADAPTER_WEIGHTS_FILE]
    files = {
        ADAPTER_CONFIG_FILE: ExportedFile(
            filename=ADAPTER_CONFIG_FILE, size_bytes=len(config), sha256=sha256(config).hexdigest(), data=config
        ),
        ADAPTER_WEIGHTS_FILE: ExportedFile(
            filename=ADAPTER_WEIGHTS_FILE,
            size_bytes=weights.size_bytes,
            sha256=weights.sha256,
            blob_key=content_key(weights.sha256),
        ),
    }
    template = stored.get(CHAT_TEMPLATE_FILE)
    if template is not None:  # the adapter's own chat template, as uploaded
        files[CHAT_TEMPLATE_FILE] = ExportedFile(filename=CHAT_TEMPLATE_FILE, size_bytes=template.size_bytes,
                                                 sha256=template.sha256, blob_key=content_key(template.sha256))
    return ExportedVersion(
        adapter_name=name,
        number=version.number,
        created_at=version.created_at,
        files=tuple(files[filename] for filename in (*ADAPTER_FILES, CHAT_TEMPLATE_FILE) if filename in files),
    )


def config_naming_base(raw: bytes, served_base: str) -> bytes:
    """adapter_config.json with `base_model_name_or_path` set to `served_base`. Bytes that already
    say so are returned untouched; others are rewritten as PEFT writes them (sorted, indent 2)."""
    config = json.loads(raw)  # validated as a JSON object when the version was registered
    if config.get(BASE_MODEL_FIELD) == served_base:
        return raw
    config[BASE_MODEL_FIELD] = served_base
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
