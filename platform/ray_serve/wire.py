"""What crosses the process boundary between the gateway and the engine replicas: plain dataclasses
of the engine's data types, so they pickle as they are."""
from __future__ import annotations

from dataclasses import dataclass

from loraloom.engine import AdapterHandle, AdapterResidency, EngineStats, SamplingParams, TenantTag

BASE_MODEL_ID = ""  # the multiplexed model id of a request without an adapter: no affinity


@dataclass(frozen=True)
class RemoteGrammar:
    """A JSON schema a replica has compiled once (so it is known to be servable); each replica that
    serves a request compiles it again, from its cache, since a compiled grammar does not pickle."""

    schema: dict | str | None  # None: any JSON object; a str: a Lark grammar (tool calls)


@dataclass(frozen=True)
class RemoteRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # its grammar travels apart, in `grammar`
    adapter: AdapterHandle | None
    tenant: TenantTag | None  # None: the engine's default tenant
    grammar: RemoteGrammar | None
    cache_salt: str | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    """One engine replica's own account of itself, as it reports it to the board (replica_board.py)."""

    replica: str  # Ray Serve's replica id
    sequence: int  # counts the replica's posts: two in flight at once may arrive out of order
    stats: EngineStats
    residency: AdapterResidency


def multiplexed_model_id(adapter: AdapterHandle | None) -> str:
    """The adapter's runtime key (tenant + content digest): the engine deployment's router
    (affinity_router.py) sends requests that carry the same id to a replica that already holds it."""
    return BASE_MODEL_ID if adapter is None else adapter.key
