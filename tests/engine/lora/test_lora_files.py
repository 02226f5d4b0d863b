"""engine/lora/files.py: the adapter file facts the engine and the platform share."""
from __future__ import annotations

import hashlib

from loraloom.engine.lora.files import file_sha256, runtime_key

WEIGHTS_SHA = "0123456789abcdef" + "f" * 48
CONFIG_SHA = "c" * 64


def test_file_sha256_reads_the_whole_file_across_chunks(tmp_path):
    data = bytes(range(256)) * 8193  # just over 2 MiB: three 1 MiB reads
    path = tmp_path / "weights"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()


def test_runtime_key_is_scope_and_content_digest():
    digest = hashlib.sha256(f"{WEIGHTS_SHA}:{CONFIG_SHA}".encode()).hexdigest()[:32]
    assert runtime_key(WEIGHTS_SHA, CONFIG_SHA) == f"server/{digest}"
    assert runtime_key(WEIGHTS_SHA, CONFIG_SHA, "acme") == f"acme/{digest}"


def test_runtime_key_changes_with_either_file_and_with_the_tenant():
    other = "1" + WEIGHTS_SHA[1:]
    key = runtime_key(WEIGHTS_SHA, CONFIG_SHA, "acme")
    assert key != runtime_key(other, CONFIG_SHA, "acme")
    assert key != runtime_key(WEIGHTS_SHA, other, "acme")  # alpha and patterns scale the weights
    assert key != runtime_key(WEIGHTS_SHA, CONFIG_SHA, "globex")  # sharing never crosses tenants
    assert key != runtime_key(WEIGHTS_SHA, CONFIG_SHA)
