"""Which of a tenant's adapters a runtime key stands for.

The engine keys adapters by tenant and content (engine/lora/files.py: runtime_key), without
names, so that two names holding the same bytes share one slot. To say "support-bot@2 is in a GPU
slot" the API maps the engine's resident keys back to the tenant's versions and checkpoints here;
one key may stand for several of them.
"""
from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from loraloom.engine import runtime_key
from loraloom.platform.db.models import Adapter, AdapterVersion, FineTuningCheckpoint, FineTuningJob
from loraloom.platform.registry.resolution import ResolvedVersion
from loraloom.platform.registry.versions import LIVE


@dataclass(frozen=True)
class KnownAs:
    adapter: str  # the adapter's name, or a checkpoint id
    version: int | None  # None for a checkpoint

    @property
    def reference(self) -> str:
        return self.adapter if self.version is None else f"{self.adapter}@{self.version}"


def names_by_runtime_key(session: Session, tenant_id: uuid.UUID) -> dict[str, list[KnownAs]]:
    """Every live version and checkpoint of the tenant, by the runtime key the engine loads it under."""
    names: dict[str, list[KnownAs]] = defaultdict(list)
    versions = session.execute(
        select(AdapterVersion, Adapter).join(Adapter, AdapterVersion.adapter_id == Adapter.id)
        .where(Adapter.tenant_id == tenant_id, LIVE).options(selectinload(AdapterVersion.files))
    )
    for version, adapter in versions:
        resolved = ResolvedVersion.of(version, adapter)
        names[resolved.key].append(KnownAs(adapter.name, version.number))
    checkpoints = session.scalars(
        select(FineTuningCheckpoint).join(FineTuningJob, FineTuningCheckpoint.job_id == FineTuningJob.id)
        .where(FineTuningJob.tenant_id == tenant_id)
    )
    for checkpoint in checkpoints:
        key = runtime_key(checkpoint.weights_sha256, checkpoint.config_sha256, tenant_id)
        names[key].append(KnownAs(checkpoint.id, None))
    return names
