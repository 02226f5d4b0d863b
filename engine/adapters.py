"""What the engine is told about an adapter, already resolved and authorized.

Three identities are kept apart (ARCHITECTURE.md): the adapter *version id*
(the registry's database row, unknown here), the runtime *adapter key* below,
and the GPU *slot index* (engine/lora.py). The key must change whenever the
weights change, because it is mixed into prefix-cache block hashes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterHandle:
    key: str  # runtime adapter key, unique per immutable weights (e.g. "support-bot@<sha256[:16]>")
    name: str  # the name the client used, echoed in responses and metrics
    uri: str  # where the PEFT files are: "file:///abs/dir", or a URI the engine's adapter fetcher understands
    sha256: str | None = None  # of adapter_model.safetensors, verified when fetched
