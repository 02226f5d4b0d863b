"""Reference -> immutable version, for the request path, with a cache in front of the database.

A reference resolves to a `Resolution`: one version, or for an alias split between versions
(splits.py) every version of the split with its weight; the version a request gets is chosen
from it after the cache, per request, so a split is cached (and invalidated) as one answer.

The runtime adapter key of a registry version is its tenant and content digest (files.runtime_key):
versions of one tenant holding the same bytes share a key, hence a slot; other tenants never do.
The cache holds answers (found or not) per (tenant, reference); every change to an
adapter's versions or aliases invalidates that adapter's entries: at once in the gateway that
made it, and in the other gateways on the same PostgreSQL database when its notification
arrives (db/change_listener.py, which suspends the cache while it cannot hear them). A TTL
bounds how stale an entry can be should a change still go unheard.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, selectinload

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterHandle, runtime_key
from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionStatus, Alias
from loraloom.platform.registry import splits
from loraloom.platform.registry.chat_templates import CHAT_TEMPLATE_FILE
from loraloom.platform.registry.fetch import version_uri
from loraloom.platform.registry.references import AdapterReference
from loraloom.platform.storage import BlobStore


@dataclass(frozen=True)
class ResolvedVersion:
    """What the gateway needs of a version to hand it to an engine: plain values, no session."""

    version_id: uuid.UUID
    tenant_id: uuid.UUID
    adapter_name: str
    number: int
    weights_sha256: str
    config_sha256: str
    template_sha256: str | None = None  # the version's own chat template (chat_template.jinja), if it has one
    tool_parser: str | None = None  # the tool-call format its adapter_config.json names, if it names one

    @classmethod
    def of(cls, version: AdapterVersion, adapter: Adapter) -> "ResolvedVersion":
        digests = {file.filename: file.sha256 for file in version.files}
        return cls(
            version_id=version.id,
            tenant_id=adapter.tenant_id,
            adapter_name=adapter.name,
            number=version.number,
            weights_sha256=digests[ADAPTER_WEIGHTS_FILE],
            config_sha256=digests[ADAPTER_CONFIG_FILE],
            template_sha256=digests.get(CHAT_TEMPLATE_FILE),
            tool_parser=version.tool_parser,
        )

    @property
    def key(self) -> str:
        return runtime_key(self.weights_sha256, self.config_sha256, self.tenant_id)

    def handle(self, store: BlobStore) -> AdapterHandle:
        return AdapterHandle(
            key=self.key,
            name=f"{self.adapter_name}@{self.number}",
            uri=version_uri(store, weights_sha256=self.weights_sha256, config_sha256=self.config_sha256),
            sha256=self.weights_sha256,
        )


@dataclass(frozen=True)
class Resolution:
    """What a reference names now: one version (weights (1,)), or an alias's split, its versions in
    number order with their weights."""

    versions: tuple[ResolvedVersion, ...]
    weights: tuple[int, ...]
    alias: str | None = None  # the alias followed; None for `name@N`

    @property
    def is_split(self) -> bool:
        return len(self.versions) > 1

    def choose(self, key: str | None) -> ResolvedVersion:
        """The version a request with routing key `key` (splits.routing_key; None: a fresh draw) gets."""
        if not self.is_split:
            return self.versions[0]
        first = self.versions[0]
        scope = f"{first.tenant_id}\x00{first.adapter_name}:{self.alias}"
        numbers = [version.number for version in self.versions]
        return self.versions[splits.choose(numbers, self.weights, scope=scope, key=key)]


def resolve_reference(session: Session, *, tenant_id: uuid.UUID, reference: AdapterReference) -> Resolution | None:
    """The ready version(s) `reference` names in the tenant, or None."""
    if reference.target_alias is None:
        row = session.execute(
            _ready_versions(tenant_id, reference.name).where(AdapterVersion.number == reference.version)
        ).one_or_none()
        return None if row is None else Resolution((ResolvedVersion.of(*row),), (1,))
    alias = session.scalar(
        select(Alias)
        .join(Adapter, Alias.adapter_id == Adapter.id)
        .where(Adapter.tenant_id == tenant_id, Adapter.name == reference.name, Alias.name == reference.target_alias)
        .options(selectinload(Alias.split))
    )
    if alias is None:
        return None
    weights = {row.version_id: row.weight for row in alias.split} or {alias.version_id: 1}
    rows = session.execute(
        _ready_versions(tenant_id, reference.name).where(AdapterVersion.id.in_(weights)).order_by(AdapterVersion.number)
    ).all()
    # Every version of a split is ready: deleting one is refused or removes the alias (versions.delete_version).
    if not rows:
        return None
    return Resolution(
        tuple(ResolvedVersion.of(*row) for row in rows), tuple(weights[row[0].id] for row in rows),
        alias=reference.target_alias,
    )


def _ready_versions(tenant_id: uuid.UUID, name: str) -> Select[tuple[AdapterVersion, Adapter]]:
    return (
        select(AdapterVersion, Adapter)
        .join(Adapter, AdapterVersion.adapter_id == Adapter.id)
        .where(Adapter.tenant_id == tenant_id, Adapter.name == name,
               AdapterVersion.status == AdapterVersionStatus.ready)
        .options(selectinload(AdapterVersion.files))
    )


@dataclass(frozen=True)
class _Entry:
    resolved: Resolution | None
    adapter_name: str
    expires_at: float


class ResolutionCache:
    """A bounded LRU of (tenant, reference text) -> Resolution | None. Thread-safe:
    lookups run in the web server's worker threads, notifications arrive on the listener's.
    It is the change listener's subscriber (db/change_listener.py's ChangeSubscriber)."""

    def __init__(self, *, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[tuple[uuid.UUID, str], _Entry] = OrderedDict()
        # (tenant, adapter name) -> the reference texts cached for it, for invalidation.
        self._texts: dict[tuple[uuid.UUID, str], set[str]] = {}
        # Bumped by every invalidation: an answer loaded while one happened may be stale, so it is not kept.
        self._generation = 0
        # False while changes may go unheard (suspend): nothing is kept, so every lookup goes to the database.
        self._serving = True
        self._lock = threading.Lock()

    def get_or_load(
        self, tenant_id: uuid.UUID, reference: AdapterReference, load: Callable[[], Resolution | None]
    ) -> Resolution | None:
        cache_key = (tenant_id, str(reference))
        with self._lock:
            entry = self._entries.get(cache_key)
            if entry is not None and entry.expires_at > self.clock():
                self._entries.move_to_end(cache_key)
                return entry.resolved
            generation = self._generation
        resolved = load()
        with self._lock:
            if self._serving and generation == self._generation:
                self._entries[cache_key] = _Entry(resolved, reference.name, expires_at=self.clock() + self.ttl_s)
                self._entries.move_to_end(cache_key)
                self._texts.setdefault((tenant_id, reference.name), set()).add(cache_key[1])
                while len(self._entries) > self.capacity:
                    self._drop(*self._entries.popitem(last=False))
        return resolved

    def invalidate(self, tenant_id: uuid.UUID, adapter_name: str) -> None:
        """Drop every cached answer about one adapter (call after any change to it)."""
        with self._lock:
            self._generation += 1
            for text in self._texts.pop((tenant_id, adapter_name), set()):
                self._entries.pop((tenant_id, text), None)

    def suspend(self) -> None:
        """Answer every lookup from the database, keeping nothing, until `reset` (a change could go unheard)."""
        with self._lock:
            self._forget_all()
            self._serving = False

    def reset(self) -> None:
        """Forget every answer and cache again (changes are heard from now on)."""
        with self._lock:
            self._forget_all()
            self._serving = True

    def _forget_all(self) -> None:
        self._generation += 1
        self._entries.clear()
        self._texts.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _drop(self, cache_key: tuple[uuid.UUID, str], entry: _Entry) -> None:
        texts = self._texts.get((cache_key[0], entry.adapter_name))
        if texts is not None:
            texts.discard(cache_key[1])
            if not texts:
                del self._texts[cache_key[0], entry.adapter_name]
