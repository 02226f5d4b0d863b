"""How an engine gets a registry version's files: by URI, from object storage, into a local
content-addressed directory, verified against the sha256 the registry recorded.

A version's URI is its weights blob's storage URI, with the config blob's digest in the
fragment: `s3://bucket/prefix/sha256/ab/<weights>#adapter_config.json=<sha256>`. Both
files are content-addressed, so the URI alone says exactly which bytes to expect.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterHandle, AdapterLoadError, fetch_local_dir
from loraloom.platform.settings import Settings
from loraloom.platform.storage import BlobNotFoundError, BlobStore, BlobVerificationError, content_key

logger = logging.getLogger(__name__)

CONFIG_FRAGMENT_PREFIX = f"{ADAPTER_CONFIG_FILE}="
PARTIAL_PREFIX = ".partial-"


def version_uri(store: BlobStore, *, weights_sha256: str, config_sha256: str) -> str:
    return f"{store.uri(content_key(weights_sha256))}#{CONFIG_FRAGMENT_PREFIX}{config_sha256}"


class StorageAdapterFetcher:
    """The engine's fetcher (loraloom.engine.AdapterFetcher) for a server with a registry.

    Registry versions are downloaded from `store` into `cache_dir/<weights>-<config>/`, once;
    the directory is bounded to `max_bytes` by evicting the least recently used versions.
    Any other handle (server-local adapters given to `serve`) is a file:// directory and
    goes to the engine's default fetcher.
    """

    def __init__(self, *, store: BlobStore, cache_dir: Path, max_bytes: int) -> None:
        self.store = store
        self.cache_dir = cache_dir
        self.max_bytes = max_bytes
        cache_dir.mkdir(parents=True, exist_ok=True)
        self._evict_lock = threading.Lock()

    def __call__(self, adapter: AdapterHandle) -> Path:
        config_sha256 = self._config_sha256(adapter)
        if config_sha256 is None:
            return fetch_local_dir(adapter)
        directory = self.cache_dir / f"{adapter.sha256}-{config_sha256}"
        if directory.is_dir():
            os.utime(directory)  # recency for eviction
            return directory
        partial = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=PARTIAL_PREFIX))
        try:
            # get_to_path checks the bytes against the digest in each content key.
            self.store.get_to_path(content_key(adapter.sha256), partial / ADAPTER_WEIGHTS_FILE)
            self.store.get_to_path(content_key(config_sha256), partial / ADAPTER_CONFIG_FILE)
            try:
                partial.rename(directory)
            except OSError:  # another fetch of the same version finished first: keep its copy
                shutil.rmtree(partial)
        except Exception as error:
            shutil.rmtree(partial, ignore_errors=True)
            # The message reaches clients: the store's own errors name the blob's key; anything else
            # (a disk error in the cache dir, a network error) would name server paths or hosts.
            if isinstance(error, (BlobNotFoundError, BlobVerificationError)):
                detail = str(error)
            else:
                logger.exception("fetching %s for adapter %r failed", adapter.uri, adapter.name)
                detail = "storage could not be read; the server log has the cause"
            raise AdapterLoadError(f"adapter {adapter.name!r}: fetching its files failed: {detail}") from error
        self._evict(keep=directory)
        return directory

    def _config_sha256(self, adapter: AdapterHandle) -> str | None:
        """The config digest of a registry version's URI in this store; None for any other URI."""
        location, marker, fragment = adapter.uri.partition("#")
        if not marker or not fragment.startswith(CONFIG_FRAGMENT_PREFIX):
            return None
        config_sha256 = fragment.removeprefix(CONFIG_FRAGMENT_PREFIX)
        try:
            content_key(config_sha256)  # validates the digest's form
            expected = self.store.uri(content_key(adapter.sha256 or ""))
        except ValueError:
            expected = None
        if location != expected:
            raise AdapterLoadError(
                f"adapter {adapter.name!r}: {adapter.uri} is not a version in this server's storage "
                "(its URI must be the weights blob's, with the handle's sha256)"
            )
        return config_sha256

    def _evict(self, *, keep: Path) -> None:
        with self._evict_lock:
            versions = [entry for entry in self.cache_dir.iterdir() if not entry.name.startswith(PARTIAL_PREFIX)]
            sizes = {entry: sum(f.stat().st_size for f in entry.iterdir()) for entry in versions}
            total = sum(sizes.values())
            for entry in sorted(versions, key=lambda e: e.stat().st_mtime_ns):
                if total <= self.max_bytes:
                    break
                if entry != keep:
                    shutil.rmtree(entry, ignore_errors=True)
                    total -= sizes[entry]
                    logger.info("adapter cache: evicted %s", entry.name)


def adapter_fetcher_from_settings(settings: Settings, store: BlobStore) -> StorageAdapterFetcher:
    """The engine's fetcher for this server's registry (pass it to AsyncEngine.create)."""
    return StorageAdapterFetcher(
        store=store, cache_dir=settings.adapter_cache_dir, max_bytes=settings.adapter_cache_max_bytes
    )
