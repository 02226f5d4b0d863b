"""The control plane's stand-in for an engine (`loraloom serve --no-engine`).

On Kubernetes the GPU pods run `loraloom serve` with an engine each, behind the InferencePool, and the
rest of the API (adapters, files, fine-tuning, keys, usage, the console) is better served by pods
without a GPU: uploads then never pass through the endpoint picker, and a GPU is not held to answer
them. Those pods run the same app over this client. It knows the served base's facts as an engine
would (EngineFacts.of_model_dir: the model directory and the engine flags, no weights loaded), which
the registry's upload checks, /v1/models and the fine-tuning routes need; it refuses generation with
a 503 that says where generation is served; it holds no adapters and no load.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from loraloom.engine import (
    AdapterHandle,
    AdapterResidency,
    EngineStats,
    FactsOfEngineElsewhere,
    RequestOutput,
    SamplingParams,
    TenantTag,
)
from loraloom.platform.metering.replica_stats import sum_stats

NO_ENGINE_DEVICE = "none"  # what /v1/engine/status reports as the device of a server with no engine


class NoEngineError(RuntimeError):
    """A generation request reached a server that runs no engine: the request was routed wrong, not
    malformed, and sending it here again will not help (no Retry-After)."""

    def __init__(self) -> None:
        super().__init__(
            "this server runs no engine (loraloom serve --no-engine: the control plane); send generation "
            "requests to the inference gateway, which routes /v1/chat/completions and /v1/completions to the "
            "engine pods"
        )


class EnginelessClient(FactsOfEngineElsewhere):
    """An EngineClient (engine/client.py) with the served base's facts and no engine."""

    async def start(self) -> None:
        """Nothing runs here."""

    async def shutdown(self) -> None:
        """Nothing runs here."""

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
        raise NoEngineError()
        yield  # an async generator, as EngineClient.generate is: the error surfaces at the first iteration

    async def compile_grammar(self, schema: dict | str | None) -> Any:
        raise NoEngineError()

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        """Nothing to warm: the engine pods fetch an adapter on its first request (alias moves reach
        them through the database's change notifications)."""

    def unload_adapter(self, key: str) -> None:
        """Nothing held here."""

    def stats(self) -> EngineStats:
        return sum_stats([])  # no replica: every count zero

    def adapter_residency(self) -> AdapterResidency:
        return AdapterResidency(slots={}, host_cache_keys=frozenset())
