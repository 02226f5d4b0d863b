"""The one path from the name a client sends (`model` / `adapter_id`) to an AdapterHandle.

`AdapterLookup` is what the API asks. With a registry configured (what `serve` builds) it is
`RegistryAdapterLookup`: a fine-tuning checkpoint id, else the caller's registry (references.py
parses the name, resolution.py answers it through a cache, so the request path does not
query the database per request; the registry service (service.py) invalidates it on every change
it makes, and its change listener on the changes other gateways announce), else the
server-local adapters given to `serve` (local.py: --adapter, --adapter-dir), which every
tenant may use.

Checkpoints belong to training, which builds on the registry: the lookup is handed a
`CheckpointFinder` rather than importing training.
"""
from __future__ import annotations

import functools
import uuid
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from loraloom.engine import AdapterHandle, runtime_key
from loraloom.platform.db import create_db_engine, create_session_factory
from loraloom.platform.db.models import Adapter, AdapterVersion, AdapterVersionStatus, Alias, FineTuningCheckpoint
from loraloom.platform.registry.catalog import ServableName, tenant_catalog
from loraloom.platform.registry.errors import AdapterNotFoundError
from loraloom.platform.registry.fetch import version_uri
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.named import NamedAdapter
from loraloom.platform.registry.references import LATEST_ALIAS, AdapterReference, parse_reference
from loraloom.platform.registry.resolution import Resolution, ResolutionCache, ResolvedVersion, resolve_reference
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.storage import BlobStore, content_key

CHECKPOINT_ID_PREFIX = "ftckpt-"


class AdapterLookup(Protocol):
    def resolve(self, model: str, tenant_id: uuid.UUID | None = None) -> AdapterHandle | None:
        """The adapter a request of `tenant_id` names; None for the base model. Raises AdapterNotFoundError
        (also for another tenant's adapter). tenant_id None: server-wide adapters only."""
        ...

    def resolve_named(
        self, model: str, tenant_id: uuid.UUID | None = None, *, routing_key: str | None = None
    ) -> NamedAdapter | None:
        """`resolve`, with the names the tenant knows the adapter by (for usage). An alias split between
        versions gives the version `routing_key` chooses (registry/splits.py: the request's user, else
        its own key), or a random one without."""
        ...

    def list_adapters(self, tenant_id: uuid.UUID | None = None) -> list[AdapterHandle]:
        """Every adapter that `tenant_id` can be served now."""
        ...

    def list_models(self, tenant_id: uuid.UUID, *, include_versions: bool) -> list[ServableName]:
        """The adapter names a request of `tenant_id` may send as `model` (catalog.py), the base aside."""
        ...

    def find_model(self, model_id: str, tenant_id: uuid.UUID) -> ServableName | None:
        """The entry list_models(include_versions=True) would show for `model_id`, or None."""
        ...


class CheckpointFinder(Protocol):
    """training.jobs.find_checkpoint: the tenant's checkpoint with this id, or None."""

    def __call__(
        self, session: Session, *, tenant_id: uuid.UUID, checkpoint_id: str
    ) -> FineTuningCheckpoint | None: ...


class RegistryAdapterLookup:
    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        store: BlobStore,
        resolutions: ResolutionCache,
        local: LocalAdapterLookup,
        find_checkpoint: CheckpointFinder,
    ) -> None:
        self.session_factory = session_factory
        self.store = store
        self.resolutions = resolutions  # the registry service's: it forgets an adapter's answers as it changes it
        self.local = local
        self.find_checkpoint = find_checkpoint

    def resolve(self, model: str, tenant_id: uuid.UUID | None = None) -> AdapterHandle | None:
        named = self.resolve_named(model, tenant_id)
        return None if named is None else named.handle

    def resolve_named(
        self, model: str, tenant_id: uuid.UUID | None = None, *, routing_key: str | None = None
    ) -> NamedAdapter | None:
        if model in self.local.base_names:
            return None
        if model.startswith(CHECKPOINT_ID_PREFIX) and tenant_id is not None:
            return NamedAdapter(self._checkpoint(model, tenant_id), name=model)
        reference = parse_reference(model)
        if reference is not None and tenant_id is not None:
            resolution = self._registry_version(reference, tenant_id)
            if resolution is not None:
                resolved = resolution.choose(routing_key)
                template = None if resolved.template_sha256 is None else self._template(resolved.template_sha256)
                return NamedAdapter(
                    resolved.handle(self.store), name=resolved.adapter_name, version=resolved.number,
                    alias=reference.target_alias, version_id=resolved.version_id, chat_template=template,
                    tool_parser=resolved.tool_parser,
                )
        if reference is not None and not reference.is_bare_name:
            raise AdapterNotFoundError(model)  # aliases and versions exist only in the registry
        return self.local.resolve_named(model, tenant_id)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (one lookup per server): templates are read per request
    def _template(self, sha256: str) -> str:
        """A version's chat template text, by its content digest (reached only through the tenant's version)."""
        with self.store.open(content_key(sha256)) as blob:
            return blob.read().decode("utf-8")

    def _registry_version(self, reference: AdapterReference, tenant_id: uuid.UUID) -> Resolution | None:
        def load() -> Resolution | None:
            with self.session_factory() as session:
                return resolve_reference(session, tenant_id=tenant_id, reference=reference)

        return self.resolutions.get_or_load(tenant_id, reference, load)

    def _checkpoint(self, checkpoint_id: str, tenant_id: uuid.UUID) -> AdapterHandle:
        """A fine-tuning checkpoint (its id is the `fine_tuned_model_checkpoint` the API shows)."""
        with self.session_factory() as session:
            checkpoint = self.find_checkpoint(session, tenant_id=tenant_id, checkpoint_id=checkpoint_id)
        if checkpoint is None:
            raise AdapterNotFoundError(checkpoint_id)
        return AdapterHandle(
            key=runtime_key(checkpoint.weights_sha256, checkpoint.config_sha256, tenant_id),
            name=checkpoint.id,
            uri=version_uri(self.store, weights_sha256=checkpoint.weights_sha256,
                            config_sha256=checkpoint.config_sha256),
            sha256=checkpoint.weights_sha256,
        )

    def list_adapters(self, tenant_id: uuid.UUID | None = None) -> list[AdapterHandle]:
        """The tenant's adapters at their `latest` version, then the server-local ones."""
        local = self.local.list_adapters(tenant_id)
        if tenant_id is None:
            return local
        with self.session_factory() as session:
            rows = session.execute(
                select(AdapterVersion, Adapter)
                .join(Adapter, AdapterVersion.adapter_id == Adapter.id)
                .join(Alias, Alias.version_id == AdapterVersion.id)
                .where(
                    Adapter.tenant_id == tenant_id,
                    Alias.name == LATEST_ALIAS,
                    AdapterVersion.status == AdapterVersionStatus.ready,
                )
                .options(selectinload(AdapterVersion.files))
                .order_by(Adapter.name)
            ).all()
            registered = [ResolvedVersion.of(version, adapter).handle(self.store) for version, adapter in rows]
        return registered + local

    def list_models(self, tenant_id: uuid.UUID, *, include_versions: bool) -> list[ServableName]:
        with self.session_factory() as session:
            registered = tenant_catalog(session, tenant_id=tenant_id, include_versions=include_versions)
        # A registry name hides a server-local adapter of the same name (resolve asks the registry first).
        shadowed = {model.id for model in registered}
        local = [model for model in self.local.list_models(tenant_id, include_versions=include_versions)
                 if model.id not in shadowed]
        return registered + local

    def find_model(self, model_id: str, tenant_id: uuid.UUID) -> ServableName | None:
        reference = parse_reference(model_id)
        if reference is None:
            return self.local.find_model(model_id, tenant_id)
        with self.session_factory() as session:
            registered = tenant_catalog(session, tenant_id=tenant_id, include_versions=True,
                                        adapter_name=reference.name)
        found = next((model for model in registered if model.id == model_id), None)
        if found is not None or not reference.is_bare_name or any(m.id == reference.name for m in registered):
            return found
        return self.local.find_model(model_id, tenant_id)


def registry_lookup(
    registry: RegistryService, database_url: str, local: LocalAdapterLookup, *, find_checkpoint: CheckpointFinder
) -> RegistryAdapterLookup:
    """The gateway's lookup: `registry`'s versions (through its resolution cache), then `local`."""
    return RegistryAdapterLookup(
        session_factory=create_session_factory(create_db_engine(database_url)), store=registry.store,
        resolutions=registry.resolutions, local=local, find_checkpoint=find_checkpoint,
    )
