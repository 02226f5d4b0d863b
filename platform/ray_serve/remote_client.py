"""RayEngineClient: the EngineClient (engine/client.py) of a set of engine replicas on Ray Serve.

The gateway code is the same over it as over the engine in its process. Each request goes through the
engine deployment's handle with its adapter's runtime key as the multiplexed model id, and streams
back; closing the stream early cancels the call, which aborts the request in its replica. A replica
that dies, or none that can take the request, is an EngineUnavailableError (the API's 503 with
Retry-After); errors of the request itself come back as the engine raised them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import ray
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from loraloom.engine import (
    AdapterHandle,
    AdapterResidency,
    EngineFacts,
    EngineStats,
    EngineUnavailableError,
    FactsOfEngineElsewhere,
    RequestOutput,
    SamplingParams,
    TenantTag,
)
from loraloom.platform.metering.replica_stats import sum_stats
from loraloom.platform.ray_serve.replica_board import replica_board
from loraloom.platform.ray_serve.wire import RemoteGrammar, RemoteRequest, ReplicaStatus, multiplexed_model_id

RETRY_AFTER_S = 1  # a replacement replica starts in seconds (its model loads); a sooner retry would fail again
BOARD_READ_TIMEOUT_S = 5.0
# The replica is gone or cannot be reached: the request is not at fault and may be sent again.
UNAVAILABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, DeploymentUnavailableError,
               BackPressureError)


class RayEngineClient(FactsOfEngineElsewhere):
    def __init__(self, handle: DeploymentHandle, facts: EngineFacts, model_dir: Path) -> None:
        super().__init__(facts, model_dir)
        self._handle = handle
        self._board = replica_board()

    async def start(self) -> None:
        """The replicas run on their own; Ray Serve starts and replaces them."""

    async def shutdown(self) -> None:
        """The replicas outlive a gateway: other gateways use them."""

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: AdapterHandle | None,
        tenant: TenantTag | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        grammar = params.grammar
        request = RemoteRequest(
            request_id=request_id, prompt_token_ids=list(prompt_token_ids),
            params=dataclasses.replace(params, grammar=None), adapter=adapter, tenant=tenant,
            grammar=grammar if isinstance(grammar, RemoteGrammar) else None, cache_salt=cache_salt,
        )
        stream = self._handle.options(stream=True, multiplexed_model_id=multiplexed_model_id(adapter)).generate.remote(
            request
        )
        finished = False
        try:
            async for output in stream:
                finished = output.finished
                yield output
        except Exception as error:
            raise engine_error(error) from None
        finally:
            if not finished:  # the caller went away, or the replica failed: stop the request there
                stream.cancel()

    async def compile_grammar(self, schema: dict | str | None) -> RemoteGrammar:
        try:
            return await self._handle.compile_grammar.remote(schema)
        except Exception as error:
            raise engine_error(error) from None

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        """Load it into the replica its requests will go to (the multiplexed model id picks it)."""
        try:
            await self._handle.options(multiplexed_model_id=multiplexed_model_id(adapter)).load_adapter.remote(adapter)
        except Exception as error:
            raise engine_error(error) from None

    def unload_adapter(self, key: str) -> None:
        """Unload it from the replica that holds it (called from a worker thread: a route that is not async)."""
        try:
            self._handle.options(multiplexed_model_id=key).unload_adapter.remote(key).result()
        except Exception as error:
            raise engine_error(error) from None

    def replica_statuses(self) -> list[ReplicaStatus]:
        """Each live replica's latest own account (replica_board.py)."""
        return ray.get(self._board.live_posts.remote(), timeout=BOARD_READ_TIMEOUT_S)

    def stats(self) -> EngineStats:
        return sum_stats([status.stats for status in self.replica_statuses()])

    def stats_by_replica(self) -> dict[str, EngineStats]:
        """Each live replica's stats by its Ray Serve id: the metrics label its own series with it."""
        return {status.replica: status.stats for status in self.replica_statuses()}

    def adapter_residency(self) -> AdapterResidency:
        """Every replica's adapters; a slot index is only meaningful within its replica, and a key held
        by several replicas shows one of their slots."""
        residencies = [status.residency for status in self.replica_statuses()]
        return AdapterResidency(
            slots={key: slot for residency in residencies for key, slot in residency.slots.items()},
            host_cache_keys=frozenset().union(*(residency.host_cache_keys for residency in residencies)),
        )


def engine_error(error: Exception) -> Exception:
    """What the gateway is told of a failed call: the engine's own error (ValueError naming a field,
    AdapterLoadError, RequestFailedError) unwrapped from Ray's, or EngineUnavailableError when the
    replica is gone or none can take the call."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause
        if isinstance(cause, UNAVAILABLE):
            return EngineUnavailableError(f"engine replica unavailable: {type(cause).__name__}", RETRY_AFTER_S)
        if isinstance(cause, Exception):
            return cause
    if isinstance(error, UNAVAILABLE):
        return EngineUnavailableError(
            "the engine replica serving this request is unavailable (it stopped or is being replaced); "
            "send the request again", RETRY_AFTER_S,
        )
    return error
