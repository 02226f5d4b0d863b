"""Host-memory cache of validated adapter weights, keyed by runtime adapter key.

The engine only knows how to fetch bytes by URI (ARCHITECTURE.md): it never
asks a database what an adapter name means. A fetcher turns a handle into a
local PEFT directory (the default one understands file:// directories; the
platform plugs in one that downloads registry versions from object storage).
The weights are verified against the handle's sha256 before they are parsed,
then kept here (bounded, LRU) so a GPU slot load is a plain copy.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from loraloom.engine.adapters import AdapterHandle
from loraloom.engine.config import ModelConfig
from loraloom.engine.lora import AdapterLoadError, AdapterWeights, load_adapter_weights
from loraloom.engine.lora_weights import ADAPTER_WEIGHTS_FILE

# Returns the local directory holding the handle's adapter_config.json and adapter_model.safetensors;
# raises AdapterLoadError when it cannot. Called from fetch threads, so it must be thread-safe.
AdapterFetcher = Callable[[AdapterHandle], Path]


def local_adapter_dir(uri: str) -> Path:
    """The directory a file:// URI names."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise AdapterLoadError(f"adapter uri: scheme {parsed.scheme!r} is not supported by this engine (use file://)")
    return Path(unquote(parsed.path))


def fetch_local_dir(adapter: AdapterHandle) -> Path:
    """The default fetcher: the adapter already lies in a local directory."""
    return local_adapter_dir(adapter.uri)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
        # Loads run in worker threads (AsyncEngine.load_adapter) while the step loop reads.
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, adapter: AdapterHandle) -> AdapterWeights:
        """The adapter's weights, fetched, verified and validated on a miss."""
        with self._lock:
            weights = self._entries.get(adapter.key)
            if weights is not None:
                self._entries.move_to_end(adapter.key)
                return weights
        weights = self._load(adapter)
        with self._lock:
            self._entries[adapter.key] = weights
            self._entries.move_to_end(adapter.key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return weights

    def discard(self, key: str) -> None:
        """Forget an adapter's weights (e.g. its version was deleted); a missing key is not an error."""
        with self._lock:
            self._entries.pop(key, None)

    def _load(self, adapter: AdapterHandle) -> AdapterWeights:
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
        return load_adapter_weights(directory, self.model_config, self.max_rank)
