"""Host-memory cache of validated adapter weights, keyed by runtime adapter key.

The engine only knows how to fetch bytes by URI (docs/ARCHITECTURE.md): it never
asks a database what an adapter name means. A fetcher turns a handle into a
local PEFT directory (the default one understands file:// directories; the
platform plugs in one that downloads registry versions from object storage).
The weights are verified against the handle's sha256 before they are parsed,
then kept here (bounded, LRU) so a GPU slot load is a plain copy.

A request holds its adapter's entry from admission to its end (`acquire` / `release`): a held
entry is never evicted, and `held` hands its weights to the step that copies them into a GPU
slot, so a step never fetches, whatever the pressure on the cache meanwhile.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import ModelConfig
from loraloom.engine.lora.errors import AdapterLoadError
from loraloom.engine.lora.files import ADAPTER_WEIGHTS_FILE, file_sha256, runtime_key_scope
from loraloom.engine.lora.weights import AdapterWeights, load_adapter_weights

# Returns the local directory holding the handle's adapter_config.json and adapter_model.safetensors;
# raises AdapterLoadError when it cannot. Called from fetch threads, so it must be thread-safe.
AdapterFetcher = Callable[[AdapterHandle], Path]

logger = logging.getLogger(__name__)


def local_adapter_dir(uri: str) -> Path:
    """The directory a file:// URI names."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise AdapterLoadError(f"adapter uri: scheme {parsed.scheme!r} is not supported by this engine (use file://)")
    return Path(unquote(parsed.path))


def fetch_local_dir(adapter: AdapterHandle) -> Path:
    """The default fetcher: the adapter already lies in a local directory."""
    return local_adapter_dir(adapter.uri)


class HostAdapterCache:
    def __init__(
        self,
        *,
        capacity: int,
        model_config: ModelConfig,
        max_rank: int,
        fetch: AdapterFetcher = fetch_local_dir,
    ) -> None:
        self.capacity = capacity
        self.model_config = model_config
        self.max_rank = max_rank
        self.fetch = fetch
        self._entries: OrderedDict[str, AdapterWeights] = OrderedDict()
        # Weights that requests hold, and how many hold them. Apart from _entries so that `discard`
        # can forget a key at once while the requests already holding it still finish on it.
        self._holds: dict[str, tuple[AdapterWeights, int]] = {}
        # Loads run in worker threads (AsyncEngine.load_adapter) while the step loop reads.
        self._lock = threading.Lock()
        # Lookups answered from memory vs fetched from storage: what operators watch for thrash.
        self.hits = 0
        self.misses = 0
        self.evictions = 0  # entries dropped to stay within capacity (not discards)
        self._nbytes = 0  # of the weights in _entries

    @property
    def nbytes(self) -> int:
        """Host memory the cached weights take (weights only requests still hold are not counted)."""
        return self._nbytes

    def keys(self) -> list[str]:
        """The keys cached now (a snapshot: safe to read from any thread)."""
        with self._lock:
            return list(self._entries)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, adapter: AdapterHandle) -> AdapterWeights:
        """The adapter's weights, fetched, verified and validated on a miss."""
        return self._get(adapter, hold=False)

    def acquire(self, adapter: AdapterHandle) -> AdapterWeights:
        """`get`, and hold the entry until `release`: a request's adapter, from admission to its end."""
        return self._get(adapter, hold=True)

    def held(self, key: str) -> AdapterWeights:
        """The weights a request holds under `key` (KeyError if none does): no fetch, ever."""
        with self._lock:
            return self._holds[key][0]

    def release(self, key: str) -> None:
        with self._lock:
            weights, count = self._holds[key]
            if count > 1:
                self._holds[key] = (weights, count - 1)
            else:
                del self._holds[key]
                self._evict_over_capacity()  # held entries may have kept the cache above its capacity

    def discard(self, key: str) -> None:
        """Forget an adapter's weights (e.g. its version was deleted); a missing key is not an error.

        Requests that already hold them keep them until they end."""
        with self._lock:
            self._drop(key)

    def _get(self, adapter: AdapterHandle, hold: bool) -> AdapterWeights:
        with self._lock:
            weights = self._entries.get(adapter.key)
            if weights is not None:
                self.hits += 1
                self._entries.move_to_end(adapter.key)
                return self._hold(adapter.key, weights) if hold else weights
            self.misses += 1
        weights = self._load(adapter)
        with self._lock:
            self._drop(adapter.key)  # another thread may have loaded it meanwhile: this copy replaces it
            self._entries[adapter.key] = weights
            self._nbytes += weights.nbytes
            if hold:  # before the eviction below, which would otherwise drop what was just loaded
                weights = self._hold(adapter.key, weights)
            self._evict_over_capacity()
        return weights

    def _hold(self, key: str, weights: AdapterWeights) -> AdapterWeights:
        """One more holder of `key` (lock held); weights held already win, so all holders share one copy."""
        held, count = self._holds.get(key, (weights, 0))
        self._holds[key] = (held, count + 1)
        return held

    def _evict_over_capacity(self) -> None:
        """Drop the least recently used entries no request holds until the cache fits (lock held)."""
        excess = len(self._entries) - self.capacity
        if excess > 0:
            for key in [key for key in self._entries if key not in self._holds][:excess]:
                self._drop(key)
                self.evictions += 1
                logger.info("adapter %s evicted from host memory", key,
                            extra={"adapter_key": key, "tenant": runtime_key_scope(key)})

    def _drop(self, key: str) -> None:
        """Forget an entry, if there is one (lock held)."""
        weights = self._entries.pop(key, None)
        if weights is not None:
            self._nbytes -= weights.nbytes

    def _load(self, adapter: AdapterHandle) -> AdapterWeights:
        started = time.monotonic()
        directory = self.fetch(adapter)
        if adapter.sha256 is not None:
            # Checked here whatever the fetcher: what is parsed is exactly what was registered.
            weights_path = directory / ADAPTER_WEIGHTS_FILE
            if not weights_path.is_file():
                raise AdapterLoadError(f"adapter {adapter.name!r}: {weights_path} not found")
            actual = file_sha256(weights_path)
            if actual != adapter.sha256:
                raise AdapterLoadError(
                    f"adapter {adapter.name!r}: {ADAPTER_WEIGHTS_FILE} sha256 is {actual}, expected {adapter.sha256}; "
                    "the files changed since the adapter was registered"
                )
        weights = load_adapter_weights(directory, self.model_config, self.max_rank)
        # The fetch, the sha256 check and the validation: what a cold adapter costs its first request.
        logger.info("adapter %r loaded into host memory", adapter.name,
                    extra={"adapter_name": adapter.name, "adapter_key": adapter.key,
                           "tenant": runtime_key_scope(adapter.key), "source": "storage", "uri": adapter.uri,
                           "bytes": weights.nbytes, "duration_ms": round((time.monotonic() - started) * 1000, 3)})
        return weights
