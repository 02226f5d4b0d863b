"""The object-storage interface: content-addressed blobs, written atomically.

A blob's key is derived from its bytes (`sha256/<first two hex>/<sha256 hex>`), so the
same file uploaded twice is stored once, and a key names exactly one content for ever:
the registry can hand a key to an engine and the engine can verify what it fetched.

Writers never expose a partial blob: every backend writes to a private staging place
first and moves the finished, hashed bytes to the content key in one step.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

COPY_CHUNK_BYTES = 1024 * 1024
_CONTENT_KEY = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{64})")


class BlobNotFoundError(LookupError):
    """No blob (or staged upload) exists under the given key."""


class BlobVerificationError(ValueError):
    """Stored or uploaded bytes do not match the size or sha256 they were declared with."""


@dataclass(frozen=True)
class BlobRef:
    key: str  # content address, see content_key()
    sha256: str  # hex digest of the bytes
    size: int  # bytes


@dataclass(frozen=True)
class PresignedPut:
    """Where a client PUTs one file directly to object storage, bypassing the gateway."""

    upload_key: str  # staging key to pass back to complete_upload(); not the content key
    url: str
    headers: dict[str, str]  # the client must send exactly these with its PUT
    expires_at: datetime  # UTC


@dataclass(frozen=True)
class PresignedGet:
    """Where a client GETs one blob's bytes directly from object storage, bypassing the gateway."""

    url: str  # carries its own signature: send no Authorization header with it
    expires_at: datetime  # UTC


def content_key(sha256: str) -> str:
    key = f"sha256/{sha256[:2]}/{sha256}"
    sha256_of_key(key)  # validates the digest's form
    return key


def sha256_of_key(key: str) -> str:
    """The digest a content key promises; refuses anything else (which also rules out path tricks)."""
    match = _CONTENT_KEY.fullmatch(key)
    if match is None or not match.group(2).startswith(match.group(1)):
        raise ValueError(f"blob key: {key!r} is not a content key of the form 'sha256/<2 hex>/<64 lowercase hex>'")
    return match.group(2)


def read_chunks(stream: BinaryIO, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
    """A blob's bytes in chunks, for streaming it out; the stream is closed at the end, also when
    the consumer stops early (a client that disconnects)."""
    with stream:
        while chunk := stream.read(chunk_bytes):
            yield chunk


class HashingReader:
    """Wraps a binary stream and hashes and counts the bytes as they are read.

    It deliberately offers no seek/tell so that upload libraries read it once, in order.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._hash.update(data)
        self.size += len(data)
        return data

    def ref(self) -> BlobRef:
        digest = self._hash.hexdigest()
        return BlobRef(key=content_key(digest), sha256=digest, size=self.size)


class BlobStore(ABC):
    """One storage backend. Keys passed in are content keys unless a method says otherwise."""

    @abstractmethod
    def put_stream(self, stream: BinaryIO) -> BlobRef:
        """Store everything `stream` yields, hashing while writing; a failure stores nothing."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable stream of the blob (close it; usable as a context manager)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the blob; deleting a missing blob is not an error."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """Where the blob lives, as a URI another process can fetch ("file:///..." or "s3://...")."""

    @abstractmethod
    def presigned_put(self, *, size: int, expires_s: int) -> PresignedPut | None:
        """A URL to PUT one file of `size` bytes straight to storage, or None when this backend
        cannot offer one (the caller then uploads through the gateway with put_stream)."""

    @abstractmethod
    def presigned_get(self, key: str, *, expires_s: int, filename: str) -> PresignedGet | None:
        """A URL to GET the blob straight from storage, saved as `filename` by browsers, or None when
        this backend cannot offer one (the caller then streams the blob through the gateway with open)."""

    @abstractmethod
    def complete_upload(self, upload_key: str, *, sha256: str, size: int) -> BlobRef:
        """Verify a presigned upload against the size and sha256 the client declared and move it
        to its content key. On a mismatch the staged bytes are deleted and BlobVerificationError
        names what differed; the client starts over with a new presigned_put."""

    @abstractmethod
    def abort_upload(self, upload_key: str) -> None:
        """Discard a presigned upload that will not be completed."""

    def remove_stale_writes(self, *, grace_s: float) -> None:
        """Remove writes in progress that a killed process left, once untouched for `grace_s`.
        Nothing to do by default: S3 keeps no partial object of a failed write (an abandoned
        multipart upload is for the bucket's AbortIncompleteMultipartUpload lifecycle rule)."""

    def put_file(self, path: Path) -> BlobRef:
        with open(path, "rb") as stream:
            return self.put_stream(stream)

    def get_to_path(self, key: str, dest: Path) -> None:
        """Download a blob to `dest` atomically, checking it against the sha256 in its key."""
        expected = sha256_of_key(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, self.open(key) as source:
                reader = HashingReader(source)
                while chunk := reader.read(COPY_CHUNK_BYTES):
                    out.write(chunk)
            got = reader.ref().sha256
            if got != expected:
                raise BlobVerificationError(f"blob {key}: downloaded bytes hash to {got}; the stored blob is corrupt")
            os.replace(tmp_name, dest)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
