"""EngineClient: the one interface between the gateway and an engine.

The gateway (loraloom.platform) holds an EngineClient and nothing else of a running engine: it
tokenizes with the client's tokenizer, hands it requests whose adapter is already resolved and
authorized (an AdapterHandle), streams their outputs, and reads its stats. Two implementations:
AsyncEngine, the engine in this process, and the Ray Serve client (platform/ray_serve), a set of
engine replicas in other processes (and the control plane's client with no engine, platform/api/engineless.py). Everything crossing this interface is plain data
(engine/outputs.py, engine/request.py, engine/lora/handle.py), so it crosses a process boundary as is.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.generation_defaults import GenerationDefaults, read_generation_defaults
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.outputs import AdapterResidency, EngineStats, RequestOutput
from loraloom.engine.request import SamplingParams
from loraloom.engine.tenancy import TenantTag
from loraloom.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineFacts:
    """An engine's facts that a gateway needs (EngineClient's data members, the tokenizer aside, which a
    gateway reads from the model directory itself): what a remote engine tells its gateway at start."""

    model_name: str
    max_model_len: int
    max_lora_rank: int
    model_config: ModelConfig
    device: str  # the torch device serving ("cpu", "cuda", "cuda:1"): what its adapter slots live in
    generation_defaults: GenerationDefaults = GenerationDefaults()

    @classmethod
    def of_model_dir(cls, model_dir: Path, config: EngineConfig, *, device: str) -> EngineFacts:
        """What engines serving `model_dir` with `config` report, without loading its weights; max_model_len
        is the context limit before the KV cache is sized (an engine's cache may hold less)."""
        model_config = ModelConfig.from_dir(model_dir)
        return cls(model_name=model_dir.name, max_model_len=config.context_limit(model_config),
                   max_lora_rank=config.max_lora_rank, model_config=model_config, device=device,
                   generation_defaults=read_generation_defaults(model_dir, config.generation_config))


class FactsOfEngineElsewhere:
    """The data members of an EngineClient whose engine runs elsewhere (other processes, or none here):
    its facts as EngineFacts, and the tokenizer from the model directory, since the gateway tokenizes
    and engines receive token ids."""

    def __init__(self, facts: EngineFacts, model_dir: Path) -> None:
        self.model_name = facts.model_name
        self.max_model_len = facts.max_model_len
        self.max_lora_rank = facts.max_lora_rank
        self.model_config = facts.model_config
        self.device = facts.device
        self.generation_defaults = facts.generation_defaults
        self.tokenizer = Tokenizer.from_dir(model_dir)


class EngineClient(Protocol):
    # Facts of the served base that the gateway needs (names, limits, upload checks, tokenizing).
    model_name: str
    max_model_len: int
    max_lora_rank: int
    model_config: ModelConfig
    device: str
    tokenizer: Tokenizer
    # What a request leaves out (temperature, top_p, ...) is taken from here before the server's defaults.
    generation_defaults: GenerationDefaults

    async def start(self) -> None:
        """Start serving (the app's start-up calls it once)."""

    async def shutdown(self) -> None:
        """Stop: open streams end; the app's shutdown calls it once."""

    def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: AdapterHandle | None,
        tenant: TenantTag | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; `tenant` (None: the default tenant) is who asks, as the gateway
        authenticated it: the scope of its prefix cache and its fair-share account (engine/tenancy.py);
        `cache_salt` isolates its prefix cache further within the tenant. Errors in the request surface at the first
        iteration (RequestFieldError naming the field, AdapterLoadError, RequestFailedError). Closing the stream before its last
        output (aclose, or cancelling the task that iterates it) aborts the request: that is the abort."""

    async def compile_grammar(self, schema: dict | str | None) -> Any:
        """A JSON schema's grammar (None: any JSON object; a str: a Lark grammar's source, as tool calls
        are constrained), for SamplingParams.grammar of a request sent to this same client. Raises
        RequestFieldError naming response_format (tools for a Lark grammar)."""

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch and validate the adapter ahead of its first request; raises AdapterLoadError."""

    def unload_adapter(self, key: str) -> None:
        """Forget an adapter's copies (its version was deleted). Thread-safe."""

    def stats(self) -> EngineStats:
        """Load and counters now (summed over replicas for a replica set). Thread-safe."""

    def adapter_residency(self) -> AdapterResidency:
        """Which adapters are resident now, by runtime key. Thread-safe."""
