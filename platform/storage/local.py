"""`file://` storage: blobs as files under one root directory, the laptop default.

Layout: `<root>/sha256/ab/<digest>` for blobs and `<root>/tmp/` for writes in progress
(same filesystem, so the final os.replace is atomic). Presigned uploads are not offered:
there is no second server to PUT to, so clients upload through the gateway.
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
    PresignedPut,
    sha256_of_key,
)


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
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp_dir, suffix=".part")
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

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(f"blob {key}: not found under {self.root}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def presigned_put(self, *, size: int, expires_s: int) -> PresignedPut | None:
        return None

    def complete_upload(self, upload_key: str, *, sha256: str, size: int) -> BlobRef:
        raise _no_presigned_uploads(upload_key)

    def abort_upload(self, upload_key: str) -> None:
        raise _no_presigned_uploads(upload_key)


def _no_presigned_uploads(upload_key: str) -> BlobNotFoundError:
    return BlobNotFoundError(
        f"upload {upload_key!r}: file:// storage issues no presigned uploads; upload through the gateway"
    )
