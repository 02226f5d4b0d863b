"""What the engine is told about an adapter, already resolved and authorized.

Three identities are kept apart (docs/ARCHITECTURE.md): the adapter *version id*
(the registry's database row, unknown here), the runtime *adapter key* below,
and the GPU *slot index* (engine/lora/layers.py). The key names content, not a name: it must
change whenever the weights (or the config that scales them) change, because it is mixed into
prefix-cache block hashes, and two references to the same content share one key, so they share
one host-cache entry, one GPU slot and their cached prefixes (files.runtime_key).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterHandle:
    key: str  # runtime adapter key: (tenant, content digest), see files.runtime_key
    name: str  # the name the client used (e.g. "support-bot@3"), in errors and metrics; not an identity
    uri: str  # where the PEFT files are: "file:///abs/dir", or a URI the engine's adapter fetcher understands
    sha256: str | None = None  # of adapter_model.safetensors, verified when fetched
