"""Content-addressed object storage for adapter files: `file://` and `s3://` backends."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from loraloom.platform.settings import (
    DEFAULT_MULTIPART_CHUNK_BYTES,
    DEFAULT_MULTIPART_THRESHOLD_BYTES,
    Settings,
)
from loraloom.platform.storage.base import (
    BlobNotFoundError,
    BlobRef,
    BlobStore,
    BlobVerificationError,
    PresignedGet,
    PresignedPut,
    content_key,
    read_chunks,
    sha256_of_key,
)
from loraloom.platform.storage.local import LocalBlobStore
from loraloom.platform.storage.s3 import S3BlobStore, make_s3_client

__all__ = [
    "BlobNotFoundError",
    "BlobRef",
    "BlobStore",
    "BlobVerificationError",
    "LocalBlobStore",
    "PresignedGet",
    "PresignedPut",
    "S3BlobStore",
    "content_key",
    "read_chunks",
    "sha256_of_key",
    "storage_from_settings",
    "storage_from_url",
]


def storage_from_url(
    url: str,
    endpoint_url: str | None = None,
    *,
    region: str | None = None,
    multipart_threshold_bytes: int = DEFAULT_MULTIPART_THRESHOLD_BYTES,
    multipart_chunk_bytes: int = DEFAULT_MULTIPART_CHUNK_BYTES,
) -> BlobStore:
    """`file:///abs/dir` -> LocalBlobStore; `s3://bucket[/prefix]` -> S3BlobStore.

    `endpoint_url`, `region` and the multipart sizes apply to s3:// only.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"storage url: {url!r} names host {parts.netloc!r}; use file:///absolute/path")
        return LocalBlobStore(Path(url2pathname(parts.path)))
    if parts.scheme == "s3":
        return S3BlobStore(
            client=make_s3_client(endpoint_url=endpoint_url, region=region),
            bucket=parts.netloc,
            prefix=parts.path,
            multipart_threshold_bytes=multipart_threshold_bytes,
            multipart_chunk_bytes=multipart_chunk_bytes,
        )
    raise ValueError(f"storage url: {url!r} has scheme {parts.scheme!r}; use file:///abs/dir or s3://bucket/prefix")


def storage_from_settings(settings: Settings) -> BlobStore:
    return storage_from_url(
        settings.storage_url,
        settings.s3_endpoint_url,
        region=settings.s3_region,
        multipart_threshold_bytes=settings.storage_multipart_threshold_bytes,
        multipart_chunk_bytes=settings.storage_multipart_chunk_bytes,
    )
