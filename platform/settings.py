"""The control plane's one configuration object, read from LORALOOM_* environment variables.

Everything has a laptop default under `data_dir` (a SQLite file and a blob folder), so
`loraloom serve` works with no configuration; a deployment points `database_url` at
PostgreSQL and `storage_url` at `s3://bucket/prefix`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD_BYTES = 64 * MIB
DEFAULT_MULTIPART_CHUNK_BYTES = 16 * MIB
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * MIB
# The tool-call formats a server (`tool_parser`) or an adapter (adapter_config.json's `tool_parser`) may name:
# auto (read the family from the chat template) and one per format of platform/api/tools/formats.py, which
# registers exactly these. Declared here, the lowest layer, because the registry checks adapters against them.
ToolParserName = Literal["auto", "smollm2", "hermes", "llama3_json"]
TOOL_PARSER_CHOICES: tuple[str, ...] = get_args(ToolParserName)


def default_data_dir() -> Path:
    # User data (database, adapter blobs) is not a cache: it lives apart from ~/.cache/loraloom,
    # which holds only re-creatable files such as the converted bundled model.
    return Path.home() / ".local" / "share" / "loraloom"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORALOOM_", extra="forbid")

    data_dir: Path = Field(default_factory=default_data_dir)
    # None = derived from data_dir after validation (see fill_data_dir_defaults).
    database_url: str | None = None  # e.g. postgresql+psycopg://user@host:5432/loraloom
    storage_url: str | None = None  # file:///abs/dir or s3://bucket/prefix
    s3_endpoint_url: str | None = None  # MinIO, R2 or any S3-compatible server; None = AWS
    s3_region: str | None = None
    # Files at least this large are uploaded to S3 in parts of storage_multipart_chunk_bytes.
    storage_multipart_threshold_bytes: int = Field(default=DEFAULT_MULTIPART_THRESHOLD_BYTES, ge=1)
    storage_multipart_chunk_bytes: int = DEFAULT_MULTIPART_CHUNK_BYTES  # S3BlobStore enforces S3's 5 MiB minimum
    presigned_url_expires_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)  # SigV4's maximum is 7 days
    # Bodies larger than this are refused with 413 before they are parsed (adapter uploads included).
    max_request_body_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BODY_BYTES, ge=1)
    # A stream sends an SSE comment after every this many seconds without an event (a slow first token),
    # so that proxies with an idle timeout keep it open.
    sse_keepalive_interval_s: float = Field(default=15.0, gt=0)
    # Usage, audit and API-key last-used rows are written off the request path in batches:
    # every record_flush_interval_ms, or as soon as record_batch_size rows are pending.
    record_flush_interval_ms: int = Field(default=1000, ge=1)
    record_batch_size: int = Field(default=500, ge=1)
    # The adapter registry. Uploads through the gateway may unpack to at most adapter_upload_max_bytes
    # (bigger adapters use the presigned S3 flow); versions the engine fetched stay in adapter_cache_dir
    # (None = <data_dir>/cache/adapters) up to adapter_cache_max_bytes; a reference's resolution is
    # cached for at most adapter_resolution_ttl_s. Changes made through this server apply at once, those
    # made through another gateway on the same PostgreSQL as soon as its notification arrives
    # (milliseconds; db/change_listener.py): the TTL only bounds a change whose notification was lost.
    adapter_upload_max_bytes: int = Field(default=2 * 1024**3, ge=1)
    adapter_cache_dir: Path | None = None
    adapter_cache_max_bytes: int = Field(default=20 * 1024**3, ge=1)
    adapter_resolution_ttl_s: float = Field(default=5.0, gt=0)
    # Uploads are unpacked in staging_dir (None = <data_dir>/staging), on the data disk rather than the
    # system temp dir. A process killed mid-upload leaves its staging folder and partial blob writes
    # behind; a server removes those at start once older than stale_file_grace_s. Several servers may
    # share one data dir, so a younger leftover may be another live server's upload in progress.
    staging_dir: Path | None = None
    stale_file_grace_s: float = Field(default=3600.0, ge=0)
    # Fine-tuning. broker_url None = the embedded broker: a folder under data_dir shared by `serve`
    # and the worker it starts (no server to run); redis://... or amqp://... for workers elsewhere.
    broker_url: str | None = None
    training_file_max_bytes: int = Field(default=512 * MIB, ge=1)  # one uploaded dataset
    training_time_limit_s: int = Field(default=24 * 3600, ge=1)  # one run; the worker kills it past this
    # A running job's worker writes a heartbeat every interval; a job not heard from for
    # heartbeat_timeout is presumed dead and requeued (at most max_attempts runs) or failed.
    training_heartbeat_interval_s: float = Field(default=10.0, gt=0)
    training_heartbeat_timeout_s: float = Field(default=120.0, gt=0)
    training_max_attempts: int = Field(default=3, ge=1)
    # `serve` restarts the worker it supervises when jobs stay queued this long while no job runs
    # (its pool is stuck, or their messages were lost), and sends the jobs again. Longer than a
    # worker takes to start and claim a job.
    training_dispatch_timeout_s: float = Field(default=180.0, gt=0)
    training_checkpoint_every: int = Field(default=100, ge=1)  # optimizer steps between checkpoints
    training_work_dir: Path | None = None  # None = <data_dir>/training; scratch space of running jobs
    # How tool calls are written and parsed (platform/api/tools/formats.py): auto reads the family from the
    # chat template. An adapter's own (adapter_config.json's tool_parser, else its own template's) comes first.
    tool_parser: ToolParserName = "auto"
    # Rate limits (platform/limits/; the limits themselves are set per tenant and key through the API).
    # The counters live in this process's memory, or with rate_limit_redis_url (redis://...) in Redis,
    # shared by every gateway, under keys starting with rate_limit_redis_prefix. A per-minute limit
    # refills over rate_limit_window_s (a minute; tests shorten it). A concurrency slot that a gateway
    # that died never released stops counting after rate_limit_concurrency_lease_s.
    rate_limit_redis_url: str | None = None
    rate_limit_redis_prefix: str = "loraloom:limits:"
    rate_limit_window_s: float = Field(default=60.0, gt=0)
    rate_limit_concurrency_lease_s: float = Field(default=3600.0, gt=0)
    # A full server: with more than this many requests waiting in the engine, inference answers 503
    # with a Retry-After. None = OVERLOAD_WAITING_PER_SEQ x the engine's max_num_seqs (serve's).
    max_waiting_requests: int | None = Field(default=None, ge=0)
    # Adapters whose requests get metric labels of their own; later ones count as model "other"
    # (engine/metric_labels.py). None = the engine's default (EngineConfig.metrics_max_adapters).
    # `serve --metrics-max-adapters` overrides it.
    metrics_max_adapters: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def fill_data_dir_defaults(self) -> "Settings":
        data_dir = self.data_dir.expanduser().resolve()
        self.data_dir = data_dir
        if self.database_url is None:
            self.database_url = f"sqlite:///{data_dir / 'loraloom.db'}"
        if self.storage_url is None:
            self.storage_url = (data_dir / "blobs").as_uri()
        if self.adapter_cache_dir is None:
            self.adapter_cache_dir = data_dir / "cache" / "adapters"
        if self.staging_dir is None:
            self.staging_dir = data_dir / "staging"
        if self.training_work_dir is None:
            self.training_work_dir = data_dir / "training"
        if self.training_heartbeat_timeout_s <= 2 * self.training_heartbeat_interval_s:
            raise ValueError(
                f"training_heartbeat_timeout_s ({self.training_heartbeat_timeout_s}) must exceed twice "
                f"training_heartbeat_interval_s ({self.training_heartbeat_interval_s}), or live jobs look dead"
            )
        return self
