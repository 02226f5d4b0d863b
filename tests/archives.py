"""In-memory .tar.gz and .zip archives for the upload tests (staging and the bad-input corpus)."""
from __future__ import annotations

import io
import tarfile
import zipfile


def tar_gz(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    """A gzipped tar of (name, bytes) files and prepared members (folders, links, special files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry)
            else:
                name, data = entry
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()
