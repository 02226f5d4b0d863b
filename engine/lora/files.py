"""The facts about an adapter's files that the engine and the platform share: their names, the
sha256 that pins the weights, and the runtime adapter key made from it.

Kept here once so that the registry that stores an adapter, the gateway that names it and the
engine that loads it cannot disagree. No torch: the platform imports this on light paths.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)

# The Llama projections an adapter may target, and the block each lives in (training's hyperparameters
# list them too, on the CLI's light path).
LORA_MODULE_PARENTS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}

# Runtime keys carry this many hex digits of the content digest: 128 bits, so that nobody can make
# two different contents share a key (and so share a slot and prefix-cache blocks), even on purpose.
KEY_HASH_CHARS = 32
SERVER_SCOPE = "server"  # the scope of server-wide adapters (--adapter, --adapter-dir) in runtime keys


def runtime_key_scope(key: str) -> str | None:
    """The scope of a runtime key: the owning tenant's id, or SERVER_SCOPE; None for a key of another
    shape (tests make their own). What the engine's adapter log lines name as the tenant."""
    scope, slash, _ = key.partition("/")
    return scope if slash else None


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks (adapter weights can be hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def runtime_key(weights_sha256: str, config_sha256: str, tenant_id: object | None = None) -> str:
    """The runtime adapter key of an adapter's content (see AdapterHandle.key): "<scope>/<digest>".

    The digest covers both files, since the config's alpha and patterns scale the weights the kernels
    multiply by; it leaves names out, so support-bot@1 and other@3 holding the same bytes share one
    key, hence one host-cache entry and one GPU slot. The scope is the owning tenant (SERVER_SCOPE for
    server-wide adapters): sharing never crosses tenants, or one tenant could learn, from a warm first
    request or an unchanged slot count, that another holds the same weights.
    """
    digest = hashlib.sha256(f"{weights_sha256}:{config_sha256}".encode()).hexdigest()[:KEY_HASH_CHARS]
    return f"{SERVER_SCOPE if tenant_id is None else tenant_id}/{digest}"
