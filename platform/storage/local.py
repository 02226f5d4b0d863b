"""`file://` storage: blobs as files under one root directory, the laptop default.

Layout: `<root>/sha256/ab/<digest>` for blobs and `<root>/tmp/` for writes in progress
(same filesystem, so the final os.replace is atomic). Presigned URLs are not offered: there
is no second server to PUT to or GET from, so clients upload and download through the gateway.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from loraloom.platform.storage.base import (
    COPY_CHUNK_BYTES,
    BlobNotFoundError,
    BlobRef,
    BlobStore,
    HashingReader,
    PresignedGet,
    PresignedPut,
    sha256_of_key,
)
from loraloom.platform.storage.leftovers import remove_stale_entries

PART_SUFFIX = ".part"


class LocalBlobStore(BlobStore):
    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"storage root: {root} must be an absolute path (file:///abs/dir)")
        self.root = root
        self._tmp_dir = root / "tmp"
        self._tmp_dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        sha256_of_key(key)  # only well-formed content keys reach the filesystem
        return self.root / key

    def put_stream(self, stream: BinaryIO) -> BlobRef:
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp_dir, suffix=PART_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                reader = HashingReader(stream)
                while chunk := reader.read(COPY_CHUNK_BYTES):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())  # durable before it becomes visible under its key
            ref = reader.ref()
            final = self._path(ref.key)
            if final.exists():
                Path(tmp_name).unlink()  # same bytes already stored: keep one copy
            else:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp_name, final)
            return ref
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def remove_stale_writes(self, *, grace_s: float) -> None:
        remove_stale_entries(self._tmp_dir, f"*{PART_SUFFIX}", grace_s=grace_s)

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            # The key only: the error reaches clients, the server's paths must not.
            raise BlobNotFoundError(f"blob {key}: not found in file storage") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def presigned_put(self, *, size: int, expires_s: int) -> PresignedPut | None:
        return None

    def presigned_get(self, key: str, *, expires_s: int, filename: str) -> PresignedGet | None:
        return None  # as for uploads: no second server, the gateway streams the file

    def complete_upload(self, upload_key: str, *, sha256: str, size: int) -> BlobRef:
        raise _no_presigned_uploads(upload_key)

    def abort_upload(self, upload_key: str) -> None:
        # Nothing was staged, so nothing to discard. Raising here (as it once did) ran in the
        # cleanup of a refused completion and replaced its 400 with a 500.
        return None


def _no_presigned_uploads(upload_key: str) -> BlobNotFoundError:
    return BlobNotFoundError(
        f"upload {upload_key!r}: file:// storage issues no presigned uploads; upload through the gateway"
    )
