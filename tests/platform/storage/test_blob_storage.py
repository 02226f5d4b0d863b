"""Both storage backends against real storage: a temp directory and a moto S3 server over HTTP."""
from __future__ import annotations

import hashlib
import io
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx
import pytest

from loraloom.platform.storage import (
    BlobNotFoundError,
    BlobStore,
    BlobVerificationError,
    LocalBlobStore,
    S3BlobStore,
    content_key,
    storage_from_settings,
    storage_from_url,
)
from loraloom.platform.settings import Settings
from loraloom.platform.storage.s3 import make_s3_client

MIB = 1024 * 1024


@dataclass
class Backend:
    """A store plus an independent view of what it physically holds."""

    store: BlobStore
    kind: str  # "file" or "s3"
    root: Path | None = None  # file://
    s3: Any = None  # a raw boto3 client, s3://
    bucket: str = ""
    prefix: str = ""

    def stored_names(self) -> list[str]:
        """Every object or file the backend holds, staging included."""
        if self.kind == "file":
            return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/")
        return sorted(obj["Key"][len(self.prefix) + 1 :] for obj in listing.get("Contents", []))

    def pending_multipart_uploads(self) -> list[str]:
        listing = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix + "/")
        return [upload["Key"] for upload in listing.get("Uploads", [])]

    def overwrite_raw(self, key: str, data: bytes) -> None:
        """Corrupt a stored blob behind the store's back."""
        if self.kind == "file":
            (self.root / key).write_bytes(data)
        else:
            self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)


def make_backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest, *, threshold: int = 8 * MIB) -> Backend:
    if kind == "file":
        root = tmp_path / "blobs"
        return Backend(store=storage_from_url(root.as_uri()), kind=kind, root=root)
    server = request.getfixturevalue("s3_server")
    prefix = f"run-{uuid.uuid4().hex}"  # each test gets its own corner of the shared bucket
    store = storage_from_url(
        f"s3://{server.bucket}/{prefix}",
        server.endpoint_url,
        region=server.region,
        multipart_threshold_bytes=threshold,
        multipart_chunk_bytes=5 * MIB,
    )
    s3 = make_s3_client(endpoint_url=server.endpoint_url, region=server.region)
    return Backend(store=store, kind=kind, s3=s3, bucket=server.bucket, prefix=prefix)


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


def read_uri(uri: str, backend: Backend) -> bytes:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(url2pathname(parts.path)).read_bytes()
    assert parts.scheme == "s3" and parts.netloc == backend.bucket
    return backend.s3.get_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))["Body"].read()


class FailingStream(io.RawIOBase):
    """Yields `good_bytes` bytes, then fails like a dropped client connection."""

    def __init__(self, good_bytes: int) -> None:
        self._left = good_bytes

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._left == 0:
            raise ConnectionResetError("client went away mid-upload")
        n = self._left if size < 0 else min(size, self._left)
        self._left -= n
        return b"\x07" * n


def test_put_get_round_trip_verifies_sha256(backend: Backend, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    source = tmp_path / "adapter_model.safetensors"
    source.write_bytes(data)

    ref = backend.store.put_file(source)

    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.size == len(data)
    assert ref.key.endswith(ref.sha256)
    with backend.store.open(ref.key) as stream:
        assert stream.read() == data
    dest = tmp_path / "fetched" / "model.safetensors"
    backend.store.get_to_path(ref.key, dest)
    assert dest.read_bytes() == data
    assert read_uri(backend.store.uri(ref.key), backend) == data
    assert backend.stored_names() == [ref.key]  # no staging leftovers


def test_same_bytes_same_key_stored_once(backend: Backend, tmp_path: Path) -> None:
    data = os.urandom(50_000)
    path = tmp_path / "a.bin"
    path.write_bytes(data)

    first = backend.store.put_file(path)
    second = backend.store.put_stream(io.BytesIO(data))
    other = backend.store.put_stream(io.BytesIO(data + b"!"))

    assert first == second
    assert other.key != first.key
    assert backend.stored_names() == sorted([first.key, other.key])


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_failed_stream_leaves_nothing_behind(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    # For S3 the failure comes after the threshold, inside a multipart upload.
    backend = make_backend(kind, tmp_path, request, threshold=1 * MIB)
    with pytest.raises(ConnectionResetError):
        backend.store.put_stream(FailingStream(good_bytes=6 * MIB + 123))
    assert backend.stored_names() == []
    if kind == "s3":
        assert backend.pending_multipart_uploads() == []


def test_delete(backend: Backend) -> None:
    ref = backend.store.put_stream(io.BytesIO(b"weights"))
    assert backend.store.exists(ref.key)

    backend.store.delete(ref.key)

    assert not backend.store.exists(ref.key)
    with pytest.raises(BlobNotFoundError):
        backend.store.open(ref.key)
    backend.store.delete(ref.key)  # deleting twice is not an error
    assert backend.stored_names() == []


def test_download_detects_corrupt_blob(backend: Backend, tmp_path: Path) -> None:
    ref = backend.store.put_stream(io.BytesIO(b"original bytes"))
    backend.overwrite_raw(ref.key, b"tampered bytes")
    dest = tmp_path / "out" / "file.bin"

    with pytest.raises(BlobVerificationError, match="corrupt"):
        backend.store.get_to_path(ref.key, dest)

    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_keys_must_be_content_addresses(backend: Backend) -> None:
    for bad in ["../../etc/passwd", "sha256/00/" + "a" * 64, "sha256/aa/" + "A" * 64]:
        with pytest.raises(ValueError, match="content key"):
            backend.store.open(bad)


def test_multipart_upload_above_threshold(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    backend = make_backend("s3", tmp_path, request, threshold=1 * MIB)
    data = os.urandom(11 * MIB + 5)
    path = tmp_path / "big.safetensors"
    path.write_bytes(data)

    ref = backend.store.put_file(path)

    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    head = backend.s3.head_object(Bucket=backend.bucket, Key=f"{backend.prefix}/{ref.key}")
    # S3 gives multipart objects an ETag of "<md5 of part md5s>-<parts>": 11 MiB in 5 MiB parts is 3.
    assert head["ETag"].strip('"').endswith("-3")
    with backend.store.open(ref.key) as stream:
        assert stream.read() == data
    assert backend.stored_names() == [ref.key]
    assert backend.pending_multipart_uploads() == []


def test_presigned_put_flow(backend: Backend) -> None:
    data = os.urandom(200_000)
    upload = backend.store.presigned_put(size=len(data), expires_s=600)
    if backend.kind == "file":
        assert upload is None  # file:// has no presigned uploads; clients upload through the gateway
        return
    assert upload is not None

    response = httpx.put(upload.url, content=data, headers=upload.headers)
    assert response.status_code == 200, response.text
    sha256 = hashlib.sha256(data).hexdigest()
    assert not backend.store.exists(content_key(sha256))  # nothing is published before verification

    ref = backend.store.complete_upload(upload.upload_key, sha256=sha256, size=len(data))

    assert ref.size == len(data)
    with backend.store.open(ref.key) as stream:
        assert stream.read() == data
    assert backend.stored_names() == [ref.key]  # the staged upload is gone


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_presigned_upload_that_does_not_match_leaves_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, wrong: str
) -> None:
    backend = make_backend("s3", tmp_path, request)
    data = os.urandom(10_000)
    upload = backend.store.presigned_put(size=len(data), expires_s=600)
    assert upload is not None
    corrupted = data[:-1] + bytes([data[-1] ^ 1])
    assert httpx.put(upload.url, content=corrupted, headers=upload.headers).status_code == 200

    declared_sha = hashlib.sha256(data).hexdigest()
    declared_size = len(data) + (1 if wrong == "size" else 0)
    with pytest.raises(BlobVerificationError, match=f"^{wrong}:"):
        backend.store.complete_upload(upload.upload_key, sha256=declared_sha, size=declared_size)

    assert backend.stored_names() == []
    with pytest.raises(BlobNotFoundError):  # one attempt per upload key
        backend.store.complete_upload(upload.upload_key, sha256=declared_sha, size=len(data))


def test_storage_from_url(tmp_path: Path) -> None:
    local = storage_from_url((tmp_path / "with space").as_uri())
    assert isinstance(local, LocalBlobStore) and local.root == tmp_path / "with space"
    s3 = storage_from_url("s3://bucket/some/prefix/", "http://127.0.0.1:1", region="us-east-1")
    assert isinstance(s3, S3BlobStore)
    key = "sha256/ab/" + "ab" * 32
    assert s3.uri(key) == f"s3://bucket/some/prefix/{key}"
    with pytest.raises(ValueError, match="scheme 'ftp'"):
        storage_from_url("ftp://host/x")
    with pytest.raises(ValueError, match="multipart_chunk_bytes"):
        storage_from_url("s3://bucket", multipart_chunk_bytes=MIB, region="us-east-1")


def test_settings_default_to_a_blob_folder_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORALOOM_DATA_DIR", str(tmp_path / "data"))
    settings = Settings()
    assert settings.storage_url == (tmp_path / "data" / "blobs").as_uri()
    store = storage_from_settings(settings)
    assert isinstance(store, LocalBlobStore) and store.root == tmp_path / "data" / "blobs"

    monkeypatch.setenv("LORALOOM_STORAGE_URL", "s3://models/adapters")
    monkeypatch.setenv("LORALOOM_S3_ENDPOINT_URL", "http://127.0.0.1:1")
    s3 = storage_from_settings(Settings(s3_region="us-east-1"))
    assert isinstance(s3, S3BlobStore) and (s3.bucket, s3.prefix) == ("models", "adapters")
