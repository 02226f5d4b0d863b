"""Server-local adapters: the `--adapter NAME=PATH` entries and the subdirectories of
`--adapter-dir`, served straight from their directories, the same for every tenant.
`LocalAdapterLookup` is an AdapterLookup (lookup.py) on its own (a server without a
registry) and the fallback of the registry's lookup for bare names.

The runtime key must change whenever the content changes (it is mixed into the
prefix-cache block hashes), so it carries a hash of both files. Hashing is done
once per (path, inode, mtime, size) of each file: the inode catches a same-size
file swapped in by rename within one timestamp tick.

A directory may hold the adapter's own chat template, as an upload may
(chat_template.jinja, or tokenizer_config.json's), and name its tool parser
(adapter_config.json's `tool_parser`): both are read and checked by the registry's
own code (chat_templates.find_chat_template, tool_parsers.declared_tool_parser) once
per version of those files, and chats to the adapter use them. A template that does
not compile or render, or a tool parser that is not one, makes the adapter
unservable, named with what is wrong (the template's line): left out of the listing,
which `serve` logs at start, and a 400 for requests naming it.
"""
from __future__ import annotations

import logging
import os
import threading
import uuid
from pathlib import Path

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterHandle, file_sha256, runtime_key
from loraloom.platform.registry.catalog import ServableName
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, find_chat_template
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError, UploadRejectedError
from loraloom.platform.registry.named import NamedAdapter
from loraloom.platform.registry.references import ALWAYS_BASE_NAMES
from loraloom.platform.registry.tool_parsers import declared_tool_parser

logger = logging.getLogger(__name__)

FileVersion = tuple[int, int, int]  # (inode, mtime_ns, size): a file's content changed when this did
# The files the chat template and the tool parser are read from.
SERVING_FILES = (CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE, ADAPTER_CONFIG_FILE)


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
        self._cache_lock = threading.Lock()
        # file path -> ((inode, mtime_ns, size), sha256); one entry per path, replaced when the file changes
        self._hashes: dict[Path, tuple[FileVersion, str]] = {}
        # directory -> (versions of SERVING_FILES, (chat template, tool parser), why they are refused or None)
        self._serving_facts: dict[Path, tuple[tuple[FileVersion | None, ...], tuple[str | None, str | None],
                                              str | None]] = {}

    def resolve(self, model: str, tenant_id: uuid.UUID | None = None) -> AdapterHandle | None:
        named = self.resolve_named(model, tenant_id)
        return None if named is None else named.handle

    def resolve_named(
        self, model: str, tenant_id: uuid.UUID | None = None, *, routing_key: str | None = None
    ) -> NamedAdapter | None:
        """Server-local adapters have one name each: no versions, no aliases (so no splits: routing_key is unused)."""
        if model in self.base_names:
            return None
        directory = self._find_directory(model)
        if directory is None:
            raise AdapterNotFoundError(model)
        return self._named(model, directory)

    def list_adapters(self, tenant_id: uuid.UUID | None = None) -> list[AdapterHandle]:
        handles = []
        for name in sorted(self._all_names()):
            try:
                handles.append(self._named(name, self._find_directory(name)).handle)
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

    def _named(self, name: str, directory: Path) -> NamedAdapter:
        directory = directory.resolve()
        handle = self._handle(name, directory)
        template, tool_parser = self._serving(name, directory)
        return NamedAdapter(handle, name=name, chat_template=template, tool_parser=tool_parser)

    def _serving(self, name: str, directory: Path) -> tuple[str | None, str | None]:
        """The directory's own chat template and tool parser, checked as an upload's are; read again only
        when their files change."""
        versions = tuple(_file_version(directory / filename) for filename in SERVING_FILES)
        with self._cache_lock:
            cached = self._serving_facts.get(directory)
        if cached is None or cached[0] != versions:
            try:
                cached = (versions, (find_chat_template(directory), declared_tool_parser(directory)), None)
            except UploadRejectedError as error:
                cached = (versions, (None, None), str(error))
            with self._cache_lock:
                self._serving_facts[directory] = cached
        _, facts, refusal = cached
        if refusal is not None:
            raise InvalidAdapterError(f"adapter {name!r}: {refusal}")
        return facts

    def _handle(self, name: str, directory: Path) -> AdapterHandle:
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
        version = _version_of(stat)
        with self._cache_lock:
            cached = self._hashes.get(path)
            if cached is not None and cached[0] == version:
                return cached[1]
            sha256 = file_sha256(path)
            self._hashes[path] = (version, sha256)
            return sha256


def _version_of(stat: os.stat_result) -> FileVersion:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _file_version(path: Path) -> FileVersion | None:
    """The file's (inode, mtime, size), None if there is none."""
    try:
        return _version_of(path.stat())
    except FileNotFoundError:
        return None


def _is_plain_directory_name(name: str) -> bool:
    """A single path component: keeps a requested name from escaping the adapter directory."""
    return name not in (".", "..") and Path(name).name == name and "\\" not in name

