"""The engine deployment: one AsyncEngine per replica (one replica per GPU: `ray_actor_options`
num_gpus, `num_replicas` or `autoscaling_config` in the Serve config file).

Requests carry their adapter's runtime key as Ray Serve's multiplexed model id
(wire.multiplexed_model_id); the deployment's request router (affinity_router.py, set by app.py) sends an
adapter's requests to a replica that already holds it unless that one is loaded well above the idlest,
and then to the idlest, which loads it. The multiplexed loader fetches the adapter
from the registry's blob store (local directory or S3, from the LORALOOM_* settings every replica
shares) into this replica's host cache.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator

import ray
from ray import serve

from loraloom.engine import AdapterHandle, AsyncEngine, EngineFacts, RequestOutput
from loraloom.engine import reserve_for_step_thread
from loraloom.platform.ray_serve.options import AppOptions
from loraloom.platform.ray_serve.replica_board import replica_board
from loraloom.platform.ray_serve.wire import RemoteGrammar, RemoteRequest, ReplicaStatus
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.settings import Settings
from loraloom.platform.storage import storage_from_settings

ENGINE_DEPLOYMENT = "LoraloomEngine"
# What a replica advertises to Ray Serve's router as held; past it the router forgets the least recently
# used. It does not bound memory: the engine's host cache and GPU slots do (EngineConfig, settings).
MAX_ADVERTISED_ADAPTERS = 256
# A replica takes many requests at once: its engine batches them (continuous batching). Past this many
# Ray Serve sends it nothing more; below it, affinity_router.py decides when an adapter spills over.
MAX_ONGOING_REQUESTS = 256


def detached(output: RequestOutput) -> RequestOutput:
    """The output with its text made here (deferred detokenization does not pickle)."""
    return dataclasses.replace(output, text=output.text_delta, deferred=None)


@serve.deployment(name=ENGINE_DEPLOYMENT, max_ongoing_requests=MAX_ONGOING_REQUESTS)
class EngineDeployment:
    def __init__(self, args: dict) -> None:
        reserve_for_step_thread()  # a replica's process serves: its engine's step thread gets torch's threads
        options = AppOptions.from_args(args)
        settings = Settings()  # LORALOOM_* from the replica's environment (the config's runtime_env)
        fetcher = adapter_fetcher_from_settings(settings, storage_from_settings(settings))
        self.engine = AsyncEngine.create(options.model_dir(), options.engine_config(), fetcher)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._board = replica_board()
        # runtime key -> the handle its loader is about to fetch (Ray Serve's loader takes only the id)
        self._handles: dict[str, AdapterHandle] = {}
        self._posts = itertools.count()
        # Posted now, not at the first request: a replacement counts in the engine's capacity (and its
        # status) while it is still idle. Not awaited: a constructor cannot, and nothing here needs it.
        self._board.post.remote(self._status(), ray.get_runtime_context().current_actor)

    # --- what the remote EngineClient calls ---------------------------------------------------------

    async def facts(self) -> EngineFacts:
        return self.engine.facts()

    async def generate(self, request: RemoteRequest) -> AsyncIterator[RequestOutput]:
        await self.engine.start()
        if request.adapter is not None:
            await self._hold_locally(request.adapter)
        params = request.params
        if request.grammar is not None:
            params = dataclasses.replace(params, grammar=await self.engine.compile_grammar(request.grammar.schema))
        first = True
        async for output in self.engine.generate(
            request_id=request.request_id, prompt_token_ids=request.prompt_token_ids, params=params,
            adapter=request.adapter, tenant=request.tenant, cache_salt=request.cache_salt,
        ):
            if first or output.finished:
                await self._post_status()  # before the output: whoever has it reads a board that counts it
                first = False
            yield detached(output)

    async def compile_grammar(self, schema: dict | str | None) -> RemoteGrammar:
        """Compile here to refuse an unservable schema before the request is sent (RequestFieldError)."""
        await self.engine.compile_grammar(schema)
        return RemoteGrammar(schema)

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        await self._hold_locally(adapter)

    async def unload_adapter(self, key: str) -> None:
        self.engine.unload_adapter(key)
        self._handles.pop(key, None)
        await self._post_status()

    async def status(self) -> ReplicaStatus:
        return self._status()

    # --- multiplexing -------------------------------------------------------------------------------

    async def _hold_locally(self, adapter: AdapterHandle) -> None:
        self._handles[adapter.key] = adapter
        await self._load_adapter(adapter.key)  # the request's multiplexed model id (wire.multiplexed_model_id)

    @serve.multiplexed(max_num_models_per_replica=MAX_ADVERTISED_ADAPTERS)
    async def _load_adapter(self, key: str) -> AdapterHandle:
        """Ray Serve's loader for a model id this replica does not hold yet: fetch and validate the
        adapter into the engine's host cache (raises AdapterLoadError), and tell the board."""
        handle = self._handles.pop(key)
        await self.engine.load_adapter(handle)
        await self._post_status()
        return handle

    def _status(self) -> ReplicaStatus:
        return ReplicaStatus(replica=self.replica, sequence=next(self._posts), stats=self.engine.stats(),
                             residency=self.engine.adapter_residency())

    async def _post_status(self) -> None:
        await self._board.post.remote(self._status(), ray.get_runtime_context().current_actor)

    async def __del__(self) -> None:
        await self.engine.shutdown()
