"""What the console's browser tests drop and upload: files dropped on the upload page's drop zone
the way a browser delivers a drag (a DataTransfer holding File objects, then dragenter, dragover
and drop), and adapters pushed straight through the API to set a page up."""
from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

import httpx
from live_api import bearer

# Builds the DataTransfer inside the page: File objects can only be made there.
MAKE_TRANSFER = """(files) => {
    const transfer = new DataTransfer();
    for (const { name, data } of files) {
        const bytes = Uint8Array.from(atob(data), (char) => char.charCodeAt(0));
        transfer.items.add(new File([bytes], name));
    }
    return transfer;
}"""
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def drop_files(page, files: dict[str, bytes]) -> None:
    """Drag `files` (name -> bytes) over the upload page's drop zone and drop them there."""
    payload = [{"name": name, "data": base64.b64encode(data).decode()} for name, data in files.items()]
    transfer = page.evaluate_handle(MAKE_TRANSFER, payload)
    zone = page.get_by_test_id("dropzone")
    for event in ("dragenter", "dragover", "drop"):
        zone.dispatch_event(event, {"dataTransfer": transfer})
    transfer.dispose()


def peft_files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in PEFT_FILES}


def tar_gz(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in PEFT_FILES:
            archive.add(directory / name, arcname=f"{directory.name}/{name}")
    return buffer.getvalue()


def push_adapter(url: str, key: str, name: str, directory: Path) -> None:
    """Register `directory` as a new version of `name` through the API."""
    files = [("files", (file_name, data)) for file_name, data in peft_files(directory).items()]
    response = httpx.post(f"{url}/v1/adapters/{name}/versions", files=files, headers=bearer(key), timeout=120)
    assert response.status_code == 201, response.text
