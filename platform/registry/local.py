"""Server-local adapters: the `--adapter NAME=PATH` entries and the subdirectories of
`--adapter-dir`, served straight from their directories, the same for every tenant.
`LocalAdapterLookup` is an AdapterLookup (lookup.py) on its own (a server without a
registry) and the fallback of the registry's lookup for bare names.

The runtime key must change whenever the content changes (it is mixed into the
prefix-cache block hashes), so it carries a hash of both files. Hashing is done
once per (path, inode, mtime, size) of each file: the inode catches a same-size
file swapped in by rename within one timestamp tick.
"""
from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterHandle, file_sha256, runtime_key
from loraloom.platform.registry.catalog import ServableName
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError
from loraloom.platform.registry.named import NamedAdapter
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES

logger = logging.getLogger(__name__)


class LocalAdapterLookup:
    """Adapters in local PEFT directories.

    `adapters` (from --adapter NAME=PATH) take precedence over same-named
    subdirectories of `adapter_dir`. The directory is consulted on every
    lookup, so adapters dropped into it after start are found. A subdirectory
    named like the base model is not served (the base name wins).
    """

    def __init__(self, base_names: set[str], adapters: dict[str, Path], adapter_dir: Path | None) -> None:
        self.base_names = frozenset(base_names) | ALWAYS_BASE_NAMES
        clashes = sorted(self.base_names & adapters.keys())
        if clashes:
            raise ValueError(f"adapter: the name(s) {clashes} are reserved for the base model; rename the adapter(s)")
        self.adapters = dict(adapters)
        self.adapter_dir = adapter_dir
        self._hash_lock = threading.Lock()
        # file path -> ((inode, mtime_ns, size), sha256); one entry per path, replaced when the file changes
        self._hashes: dict[Path, tuple[tuple[int, int, int], str]] = {}

    def resolve(self, model: str, tenant_id: uuid.UUID | None = None) -> AdapterHandle | None:
        if model in self.base_names:
            return None
        directory = self._find_directory(model)
        if directory is None:
            raise AdapterNotFoundError(model)
        return self._handle(model, directory)

    def resolve_named(self, model: str, tenant_id: uuid.UUID | None = None) -> NamedAdapter | None:
        """Server-local adapters have one name each: no versions, no aliases."""
        handle = self.resolve(model, tenant_id)
        return None if handle is None else NamedAdapter(handle, name=handle.name)

    def list_adapters(self, tenant_id: uuid.UUID | None = None) -> list[AdapterHandle]:
        handles = []
        for name in sorted(self._all_names()):
            try:
                handles.append(self._handle(name, self._find_directory(name)))
            except InvalidAdapterError as error:
                # Listed anyway would promise something unservable; say why it is left out.
                logger.warning("adapter not listed: %s", error)
        return handles

    def list_models(self, tenant_id: uuid.UUID | None = None, *, include_versions: bool = False) -> list[ServableName]:
        """Local adapters have no versions or aliases: one name each, the same for every tenant."""
        return [ServableName(id=handle.name) for handle in self.list_adapters(tenant_id)]

    def find_model(self, model_id: str, tenant_id: uuid.UUID | None = None) -> ServableName | None:
        return next((model for model in self.list_models(tenant_id) if model.id == model_id), None)

    def _all_names(self) -> set[str]:
        names = set(self.adapters)
        if self.adapter_dir is not None and self.adapter_dir.is_dir():
            names |= {
                entry.name
                for entry in self.adapter_dir.iterdir()
                if (entry / ADAPTER_CONFIG_FILE).is_file() and entry.name not in self.base_names
            }
        return names

    def _find_directory(self, name: str) -> Path | None:
        if name in self.adapters:
            return self.adapters[name]
        if self.adapter_dir is None or not _is_plain_directory_name(name):
            return None
        candidate = self.adapter_dir / name
        return candidate if (candidate / ADAPTER_CONFIG_FILE).is_file() else None

    def _handle(self, name: str, directory: Path) -> AdapterHandle:
        directory = directory.resolve()
        weights_sha256 = self._sha256(name, directory / ADAPTER_WEIGHTS_FILE)
        config_sha256 = self._sha256(name, directory / ADAPTER_CONFIG_FILE)
        return AdapterHandle(
            key=runtime_key(weights_sha256, config_sha256), name=name, uri=directory.as_uri(), sha256=weights_sha256
        )

    def _sha256(self, name: str, path: Path) -> str:
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise InvalidAdapterError(
                f"adapter {name!r}: {path} not found; a PEFT adapter directory needs "
                f"{ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE} (pickled .bin weights are not loaded)"
            ) from None
        version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._hash_lock:
            cached = self._hashes.get(path)
            if cached is not None and cached[0] == version:
                return cached[1]
            sha256 = file_sha256(path)
            self._hashes[path] = (version, sha256)
            return sha256


def _is_plain_directory_name(name: str) -> bool:
    """A single path component: keeps a requested name from escaping the adapter directory."""
    return name not in (".", "..") and Path(name).name == name and "\\" not in name

