"""`s3://bucket/prefix` storage through boto3: AWS S3 or any S3-compatible server
(MinIO, Cloudflare R2, Ceph) reached through a configurable endpoint URL.

Every write lands first under `<prefix>/uploads/<random>` (a staging key), is hashed on the
way in, and only then is copied server-side to its content key `<prefix>/sha256/ab/<digest>`.
That keeps content keys trustworthy even for presigned uploads, where the bytes come from
a client we cannot watch: a client can only ever write to its own staging key, and
complete_upload() re-reads and verifies that object before anything is published.

Staged objects are deleted when a write finishes or fails. Ones a client started and
abandoned stay until a bucket lifecycle rule on `<prefix>/uploads/` expires them.
"""
from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from loraloom.engine import RequestFieldError
from loraloom.platform.storage.base import (
    COPY_CHUNK_BYTES,
    BlobNotFoundError,
    BlobRef,
    BlobStore,
    BlobVerificationError,
    HashingReader,
    PresignedGet,
    PresignedPut,
    sha256_of_key,
)

S3_MIN_PART_BYTES = 5 * 1024 * 1024  # every part but the last must be at least this large
S3_MAX_SINGLE_PUT_BYTES = 5 * 1024**3  # one presigned PUT can carry at most this much
S3_MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600  # SigV4 limit
OCTET_STREAM = "application/octet-stream"
_UPLOAD_KEY = re.compile(r"uploads/[0-9a-f]{32}")
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}


def make_s3_client(*, endpoint_url: str | None, region: str | None) -> Any:
    """A boto3 S3 client; credentials come from boto3's usual chain (environment, ~/.aws, instance role)."""
    # Path-style addressing (`endpoint/bucket/key`) for custom endpoints: MinIO and most
    # self-hosted servers have no per-bucket DNS names; AWS itself keeps boto3's default.
    addressing_style = "path" if endpoint_url else "auto"
    config = BotoConfig(signature_version="s3v4", s3={"addressing_style": addressing_style})
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


class S3BlobStore(BlobStore):
    def __init__(
        self,
        *,
        client: Any,  # a boto3 S3 client, see make_s3_client
        bucket: str,
        prefix: str,
        multipart_threshold_bytes: int,
        multipart_chunk_bytes: int,
    ) -> None:
        if not bucket:
            raise ValueError("storage url: the bucket is empty; use s3://bucket/prefix")
        if multipart_chunk_bytes < S3_MIN_PART_BYTES:
            raise ValueError(
                f"multipart_chunk_bytes: {multipart_chunk_bytes} is below S3's minimum part size of {S3_MIN_PART_BYTES}"
            )
        self._client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold_bytes,
            multipart_chunksize=multipart_chunk_bytes,
            max_concurrency=4,
        )

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _content_object(self, key: str) -> str:
        sha256_of_key(key)
        return self._object_key(key)

    def _upload_object(self, upload_key: str) -> str:
        if _UPLOAD_KEY.fullmatch(upload_key) is None:
            raise RequestFieldError("upload_key", f"{upload_key!r} is not an upload key issued by presigned_put")
        return self._object_key(upload_key)

    def _new_upload_key(self) -> str:
        return f"uploads/{uuid.uuid4().hex}"

    def _head(self, object_key: str) -> dict[str, Any] | None:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=object_key)
        except ClientError as error:
            if error.response["Error"]["Code"] in _MISSING_CODES:
                return None
            raise

    def _get(self, object_key: str, *, if_match: str | None = None) -> BinaryIO:
        conditions = {"IfMatch": if_match} if if_match else {}
        try:
            return self._client.get_object(Bucket=self.bucket, Key=object_key, **conditions)["Body"]
        except ClientError as error:
            if error.response["Error"]["Code"] in _MISSING_CODES:
                raise BlobNotFoundError(f"blob s3://{self.bucket}/{object_key}: not found") from None
            raise

    def _publish(self, upload_key: str, ref: BlobRef, *, etag: str) -> None:
        """Copy a verified staged object to its content key unless that content is already stored.

        CopySourceIfMatch makes the copy fail if the staged object was overwritten after it was
        verified (a presigned URL stays usable until it expires).
        """
        if self.exists(ref.key):
            return
        self._client.copy(
            {"Bucket": self.bucket, "Key": self._upload_object(upload_key)},
            self.bucket,
            self._content_object(ref.key),
            ExtraArgs={"CopySourceIfMatch": etag},
            Config=self._transfer,
        )

    def put_stream(self, stream: BinaryIO) -> BlobRef:
        upload_key = self._new_upload_key()
        staged = self._upload_object(upload_key)
        reader = HashingReader(stream)
        try:
            # Streams above the threshold go up as a multipart upload, which S3 discards
            # (and boto3 aborts) if any part fails: no partial object becomes visible.
            self._client.upload_fileobj(reader, self.bucket, staged, Config=self._transfer)
            ref = reader.ref()
            self._publish(upload_key, ref, etag=self._head(staged)["ETag"])
            return ref
        finally:
            self._client.delete_object(Bucket=self.bucket, Key=staged)

    def open(self, key: str) -> BinaryIO:
        return self._get(self._content_object(key))

    def exists(self, key: str) -> bool:
        return self._head(self._content_object(key)) is not None

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._content_object(key))

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._content_object(key)}"

    def presigned_put(self, *, size: int, expires_s: int) -> PresignedPut | None:
        if not 0 <= size <= S3_MAX_SINGLE_PUT_BYTES:
            raise RequestFieldError(
                "size", f"{size} bytes is outside 0..{S3_MAX_SINGLE_PUT_BYTES}, the range of one S3 PUT")
        expires_at = _expiry(expires_s)
        upload_key = self._new_upload_key()
        # Content-Length is part of the signature, so S3 refuses a PUT of any other size.
        url = self._client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._upload_object(upload_key),
                "ContentType": OCTET_STREAM,
                "ContentLength": size,
            },
            ExpiresIn=expires_s,
            HttpMethod="PUT",
        )
        return PresignedPut(
            upload_key=upload_key,
            url=url,
            headers={"Content-Type": OCTET_STREAM},
            expires_at=expires_at,
        )

    def presigned_get(self, key: str, *, expires_s: int, filename: str) -> PresignedGet | None:
        expires_at = _expiry(expires_s)
        url = self._client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._content_object(key),
                # Blobs are named by their digest; a browser following the URL saves the file's real name.
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
            },
            ExpiresIn=expires_s,
            HttpMethod="GET",
        )
        return PresignedGet(url=url, expires_at=expires_at)

    def complete_upload(self, upload_key: str, *, sha256: str, size: int) -> BlobRef:
        staged = self._upload_object(upload_key)
        try:
            head = self._head(staged)
            if head is None:
                raise BlobNotFoundError(f"upload {upload_key}: nothing was uploaded; PUT the file to its URL first")
            if head["ContentLength"] != size:
                raise BlobVerificationError(
                    f"size: the uploaded file has {head['ContentLength']} bytes but {size} were declared"
                )
            with self._get(staged, if_match=head["ETag"]) as body:
                reader = HashingReader(body)
                while reader.read(COPY_CHUNK_BYTES):
                    pass
            ref = reader.ref()
            if ref.sha256 != sha256:
                raise BlobVerificationError(
                    f"sha256: the uploaded file hashes to {ref.sha256} but {sha256} was declared"
                )
            self._publish(upload_key, ref, etag=head["ETag"])
            return ref
        finally:
            # One attempt per upload key: verified or not, the staged object goes.
            self._client.delete_object(Bucket=self.bucket, Key=staged)

    def abort_upload(self, upload_key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._upload_object(upload_key))


def _expiry(expires_s: int) -> datetime:
    """When a URL presigned now for `expires_s` seconds expires; refuses what SigV4 cannot sign."""
    if not 1 <= expires_s <= S3_MAX_PRESIGN_EXPIRES_S:
        raise RequestFieldError("expires_s", f"{expires_s} is outside 1..{S3_MAX_PRESIGN_EXPIRES_S} seconds")
    return datetime.now(timezone.utc) + timedelta(seconds=expires_s)
