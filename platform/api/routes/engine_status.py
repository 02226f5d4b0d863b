"""GET /v1/engine/status: the caller's tenant's view of the shared engine: its own requests running
and waiting, and where its own adapters are resident (in a GPU slot, or only in the host cache; an
adapter in neither is in storage only, and is fetched on its next request).

Nothing engine-wide is in a tenant's view: a token counter or the slots and KV blocks in use move
with other tenants' traffic and would tell one tenant what another sends. The operator's key also
gets `server`, the whole engine's load (what /metrics gives Prometheus).
"""
from __future__ import annotations

import uuid
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from loraloom.engine import AdapterResidency, EngineStats
from loraloom.platform.api.deps import CallerDep, EngineDep, SessionDep
from loraloom.platform.api.errors import ERROR_RESPONSES
from loraloom.platform.registry.residency import names_by_runtime_key

router = APIRouter(tags=["operations"], responses=ERROR_RESPONSES)


class ResidentAdapter(BaseModel):
    adapter: str = Field(description="The adapter's name, or a checkpoint id for a fine-tuning checkpoint.")
    version: int | None = Field(description="The version number; None for a checkpoint.")
    reference: str = Field(description="What to send as `model` for exactly these weights: name@N, or the checkpoint id.")
    location: Literal["gpu", "host"] = Field(description="gpu: in one of the engine's adapter slots (and the host cache), "
                                             "which are in CPU memory when `device` is cpu; host: host cache only.")
    slot: int | None = Field(description="The adapter slot index when location is gpu. Versions and checkpoints whose "
                             "weights are byte-identical share one runtime key and so one slot: each is listed.")


class ModelSpeculation(BaseModel):
    """Speculative decoding for one model (the base, or an adapter version): how many of its proposed
    tokens the model agreed with since the server started."""

    tenant: str | None = Field(default=None, description="The tenant's name; only in the operator's view.")
    model: str = Field(description="base, or the adapter version (name@N) or checkpoint id; other past the "
                       "server's --metrics-max-adapters cap.")
    drafts: int = Field(description="Drafts verified: a request's proposed tokens checked in one step.")
    draft_tokens: int = Field(description="Proposed tokens checked.")
    accepted_tokens: int = Field(description="Proposed tokens the model agreed with (each saved a step).")
    acceptance_rate: float | None = Field(description="accepted_tokens / draft_tokens; None before any draft.")


class ServerSpeculation(BaseModel):
    """Speculative decoding across the engine (serve --speculation)."""

    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None = Field(description="accepted_tokens / draft_tokens; None before any draft.")
    store_tokens: int = Field(description="Tokens of recent answers kept to propose from, per tenant and adapter "
                              "(never proposed to another tenant).")
    store_bytes: int = Field(description="Memory those answers and their index take (an estimate).")
    models: list[ModelSpeculation] = Field(description="Per tenant and model, most drafted first.")


class ServerEngineStatus(BaseModel):
    """The whole engine, every tenant's load in it: the operator's view."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_cached: int
    adapter_slots_used: int
    adapter_slots_total: int
    prompt_tokens_total: int = Field(description="Since the server started; rates come from two readings.")
    generation_tokens_total: int
    preemptions_total: int
    host_cache_hits: int = Field(description="Adapter lookups the host cache answered without fetching.")
    host_cache_misses: int = Field(description="Adapter lookups that fetched weights from storage.")
    host_cache_adapters: int = Field(description="Adapters in the host cache now, all tenants.")
    speculation: ServerSpeculation


class EngineStatus(BaseModel):
    """The caller's tenant's view: nothing here moves with another tenant's traffic, except where the
    tenant's own requests and adapters are (waiting rather than running, in the host cache rather than
    a slot), which is what a shared engine means."""

    object: Literal["engine.status"] = "engine.status"
    model: str
    device: str = Field(description="The torch device the engine serves on (cpu, cuda, cuda:N): on cpu, an adapter "
                        "'slot' is a slot of the engine's LoRA weight table in host memory, not GPU memory; none: this "
                        "server runs no engine (serve --no-engine, the control plane), and the counts are zero.")
    num_running: int = Field(description="The caller's tenant's requests generating now.")
    num_waiting: int = Field(description="The caller's tenant's requests queued in the engine now.")
    adapters: list[ResidentAdapter] = Field(description="The caller's tenant's adapters resident now.")
    speculation: list[ModelSpeculation] = Field(
        description="Speculative decoding for the caller's tenant's models: its own drafts only, most drafted first.")
    server: ServerEngineStatus | None = Field(
        default=None, description="The whole engine, all tenants: only in the operator's view (its admin key).",
    )


def resident_adapters(residency: AdapterResidency, session: Session, tenant_id: uuid.UUID) -> list[ResidentAdapter]:
    """The tenant's versions and checkpoints whose weights are resident; names holding the same
    bytes share a key (and so a slot), and each is listed."""
    names = names_by_runtime_key(session, tenant_id)  # only this tenant's keys: others' never match
    found = []
    for key in sorted(residency.resident_keys & names.keys()):
        slot = residency.slots.get(key)
        for known in names[key]:
            found.append(ResidentAdapter(
                adapter=known.adapter, version=known.version, reference=known.reference,
                location="gpu" if slot is not None else "host", slot=slot,
            ))
    return sorted(found, key=lambda resident: resident.reference)


def server_view(stats: EngineStats, residency: AdapterResidency) -> ServerEngineStatus:
    drafted = sum(stats.spec_decode_draft_tokens_total.values())
    accepted = sum(stats.spec_decode_accepted_tokens_total.values())
    return ServerEngineStatus(
        num_running=stats.num_running, num_waiting=stats.num_waiting,
        kv_blocks_used=stats.kv_blocks_used, kv_blocks_total=stats.kv_blocks_total,
        kv_blocks_cached=stats.kv_blocks_cached,
        adapter_slots_used=stats.adapter_slots_used, adapter_slots_total=stats.adapter_slots_total,
        prompt_tokens_total=stats.prompt_tokens_total, generation_tokens_total=stats.generation_tokens_total,
        preemptions_total=stats.preemptions_total,
        host_cache_hits=stats.host_cache_hits_total, host_cache_misses=stats.host_cache_misses_total,
        host_cache_adapters=len(residency.host_cache_keys),
        speculation=ServerSpeculation(
            draft_tokens=drafted, accepted_tokens=accepted, acceptance_rate=_rate(accepted, drafted),
            store_tokens=stats.spec_decode_store_tokens, store_bytes=stats.spec_decode_store_bytes,
            models=model_speculation(stats, tenant=None),
        ),
    )


def model_speculation(stats: EngineStats, tenant: str | None) -> list[ModelSpeculation]:
    """Per (tenant, model) drafting counts: one tenant's (by name), or every tenant's (None, named in each line)."""
    found = []
    for (owner, model), drafts in stats.spec_decode_drafts_total.items():
        if tenant is not None and owner != tenant:
            continue
        drafted = stats.spec_decode_draft_tokens_total.get((owner, model), 0)
        accepted = stats.spec_decode_accepted_tokens_total.get((owner, model), 0)
        found.append(ModelSpeculation(tenant=owner if tenant is None else None, model=model, drafts=drafts,
                                      draft_tokens=drafted, accepted_tokens=accepted,
                                      acceptance_rate=_rate(accepted, drafted)))
    return sorted(found, key=lambda line: (-line.draft_tokens, line.tenant or "", line.model))


def _rate(accepted: int, drafted: int) -> float | None:
    return round(accepted / drafted, 4) if drafted else None


@router.get("/v1/engine/status", response_model=EngineStatus)
def get_engine_status(caller: CallerDep, engine: EngineDep, session: SessionDep) -> EngineStatus:
    stats = engine.stats()
    residency = engine.adapter_residency()
    return EngineStatus(
        model=engine.model_name,
        device=engine.device,
        # The engine's own per-tenant counts (engine/fair_share.py), keyed by the tenant's name.
        num_running=stats.running_per_tenant.get(caller.tenant_name, 0),
        num_waiting=stats.queued_per_tenant.get(caller.tenant_name, 0),
        adapters=resident_adapters(residency, session, caller.tenant_id),
        speculation=model_speculation(stats, tenant=caller.tenant_name),
        server=server_view(stats, residency) if caller.operator else None,
    )
