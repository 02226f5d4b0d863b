"""LocalAdapterLookup: names, directory scan, runtime keys that follow the weights."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from loraloom.engine.lora.files import runtime_key
from loraloom.engine.lora.weights import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError
from loraloom.platform.registry.local import LocalAdapterLookup

BASE_NAME = "SmolLM2-135M-Instruct"


def write_adapter_dir(directory: Path, weights: bytes) -> Path:
    """The two files of a PEFT adapter directory. The lookup only hashes the weights, it does not parse them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ADAPTER_CONFIG_FILE).write_text('{"peft_type": "LORA", "r": 4}')
    (directory / ADAPTER_WEIGHTS_FILE).write_bytes(weights)
    return directory


def expected_key(directory: Path) -> str:
    """Server-wide scope, digest of both files (engine/lora/files.py)."""
    digests = [hashlib.sha256((directory / name).read_bytes()).hexdigest()
               for name in (ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE)]
    return runtime_key(*digests)


def test_named_adapter_resolves_to_handle_with_hash_key(tmp_path):
    weights = os.urandom(1000)
    directory = write_adapter_dir(tmp_path / "somewhere" / "support", weights)
    lookup = LocalAdapterLookup({BASE_NAME}, {"support-bot": directory}, None)
    handle = lookup.resolve("support-bot")
    assert handle.name == "support-bot"
    assert handle.key == expected_key(directory)
    assert handle.sha256 == hashlib.sha256(weights).hexdigest()
    assert handle.uri == directory.resolve().as_uri()
    assert [h.name for h in lookup.list_adapters()] == ["support-bot"]


@pytest.mark.parametrize("name", ["base", "", BASE_NAME])
def test_base_names_resolve_to_none(tmp_path, name):
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    assert lookup.resolve(name) is None


def test_unknown_name_raises_not_found_naming_it(tmp_path):
    write_adapter_dir(tmp_path / "known", b"w")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    with pytest.raises(AdapterNotFoundError) as raised:
        lookup.resolve("missing-one")
    assert raised.value.name == "missing-one"
    assert "missing-one" in str(raised.value)


@pytest.mark.parametrize("name", ["..", ".", "../outside", "known/../known", "/etc"])
def test_names_that_are_paths_do_not_escape_the_adapter_dir(tmp_path, name):
    adapter_dir = tmp_path / "adapters"
    write_adapter_dir(adapter_dir / "known", b"w")
    write_adapter_dir(tmp_path / "outside", b"w")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, adapter_dir)
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve(name)


def test_adapter_dir_scan_and_adapters_dropped_in_later(tmp_path):
    write_adapter_dir(tmp_path / "alpha", b"a")
    (tmp_path / "not-an-adapter").mkdir()
    (tmp_path / "not-an-adapter" / "notes.txt").write_text("no adapter_config.json here")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    assert [h.name for h in lookup.list_adapters()] == ["alpha"]
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("not-an-adapter")
    with pytest.raises(AdapterNotFoundError):
        lookup.resolve("gamma")

    gamma = write_adapter_dir(tmp_path / "gamma", b"g")
    assert lookup.resolve("gamma").key == expected_key(gamma)
    assert [h.name for h in lookup.list_adapters()] == ["alpha", "gamma"]


def test_named_adapter_wins_over_same_named_directory(tmp_path):
    write_adapter_dir(tmp_path / "dir" / "alpha", b"from the directory")
    explicit = write_adapter_dir(tmp_path / "explicit", b"given with --adapter")
    lookup = LocalAdapterLookup({BASE_NAME}, {"alpha": explicit}, tmp_path / "dir")
    assert lookup.resolve("alpha").key == expected_key(explicit)
    assert [h.name for h in lookup.list_adapters()] == ["alpha"]


def test_key_changes_when_weights_change(tmp_path):
    directory = write_adapter_dir(tmp_path / "alpha", b"version one")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    first = lookup.resolve("alpha")
    assert first.key == expected_key(directory)

    # A different size: a new key.
    (directory / ADAPTER_WEIGHTS_FILE).write_bytes(b"version two, longer")
    second = lookup.resolve("alpha")
    assert second.key == expected_key(directory) != first.key

    # Same size, swapped in by rename (how trainers and uploads replace files): a new inode, a new key,
    # even if the modification time ends up identical.
    stat = (directory / ADAPTER_WEIGHTS_FILE).stat()
    replacement = directory / "incoming.tmp"
    replacement.write_bytes(b"version 3!, longer!")
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replacement.replace(directory / ADAPTER_WEIGHTS_FILE)
    assert lookup.resolve("alpha").key == expected_key(directory) != second.key


def test_hash_is_computed_once_per_file_version(tmp_path):
    directory = write_adapter_dir(tmp_path / "alpha", b"original bytes")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    key = lookup.resolve("alpha").key
    # Rewrite in place and restore the timestamp: inode, size and mtime are unchanged, so the
    # cached hash is used (proof that the file is not re-read on every request).
    weights = directory / ADAPTER_WEIGHTS_FILE
    stat = weights.stat()
    with weights.open("r+b") as handle:
        handle.write(b"ORIGINAL")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert lookup.resolve("alpha").key == key
    # Touching the file makes it a new version: re-hashed.
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert lookup.resolve("alpha").key == expected_key(directory) != key


def test_adapter_without_safetensors_weights_is_invalid_and_not_listed(tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    (directory / ADAPTER_CONFIG_FILE).write_text("{}")
    (directory / "adapter_model.bin").write_bytes(b"pickle")
    write_adapter_dir(tmp_path / "good", b"g")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    with pytest.raises(InvalidAdapterError, match=ADAPTER_WEIGHTS_FILE):
        lookup.resolve("pickled")
    assert [h.name for h in lookup.list_adapters()] == ["good"]


@pytest.mark.parametrize("reserved", ["base", BASE_NAME])
def test_adapter_named_like_the_base_is_refused(tmp_path, reserved):
    directory = write_adapter_dir(tmp_path / "x", b"w")
    with pytest.raises(ValueError, match="reserved for the base model"):
        LocalAdapterLookup({BASE_NAME}, {reserved: directory}, None)


def test_directory_named_like_the_base_is_not_served_as_adapter(tmp_path):
    write_adapter_dir(tmp_path / BASE_NAME, b"w")
    lookup = LocalAdapterLookup({BASE_NAME}, {}, tmp_path)
    assert lookup.resolve(BASE_NAME) is None
    assert lookup.list_adapters() == []
