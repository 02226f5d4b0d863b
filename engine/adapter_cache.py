"""Host-memory cache of validated adapter weights, keyed by runtime adapter key.

The engine only knows how to fetch bytes by URI (ARCHITECTURE.md): it never
asks a database what an adapter name means. Weights are verified against the
handle's sha256 before they are parsed, then kept here (bounded, LRU) so a GPU
slot load is a plain copy.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from urllib.parse import unquote, urlparse

from loraloom.engine.adapters import AdapterHandle
from loraloom.engine.config import ModelConfig
from loraloom.engine.lora import AdapterLoadError, AdapterWeights, load_adapter_weights

WEIGHTS_FILE = "adapter_model.safetensors"


def local_adapter_dir(uri: str) -> Path:
    """The directory a handle's URI names. Only file:// exists today; object storage plugs in here."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise AdapterLoadError(f"adapter uri: scheme {parsed.scheme!r} is not supported by this engine (use file://)")
    return Path(unquote(parsed.path))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class HostAdapterCache:
    def __init__(self, *, capacity: int, model_config: ModelConfig, max_rank: int) -> None:
        self.capacity = capacity
        self.model_config = model_config
        self.max_rank = max_rank
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
        weights = self._fetch(adapter)
        with self._lock:
            self._entries[adapter.key] = weights
            self._entries.move_to_end(adapter.key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return weights

    def _fetch(self, adapter: AdapterHandle) -> AdapterWeights:
        directory = local_adapter_dir(adapter.uri)
        if adapter.sha256 is not None:
            weights_path = directory / WEIGHTS_FILE
            if not weights_path.is_file():
                raise AdapterLoadError(f"adapter {adapter.name!r}: {weights_path} not found")
            actual = file_sha256(weights_path)
            if actual != adapter.sha256:
                raise AdapterLoadError(
                    f"adapter {adapter.name!r}: {WEIGHTS_FILE} sha256 is {actual}, expected {adapter.sha256}; "
                    "the files changed since the adapter was registered"
                )
        return load_adapter_weights(directory, self.model_config, self.max_rank)
