"""AsyncEngine: the step loop on its own thread, one async stream per request.

All LLMEngine calls that change requests run on a single step thread, so the engine itself
needs no locks. The thread steps back to back while there is work: it hands each step's
outputs to the event loop (call_soon_threadsafe) and starts the next step at once, so
dispatching outputs, detokenizing and answering HTTP on the loop overlap the next step's
compute instead of taking turns with it (torch releases the GIL inside its ops). Adds and
aborts are queued by the loop under a lock and applied by the thread between steps.

The step thread has all of torch's threads and the engine's helper threads one each
(engine/torch_threads.py says why); AsyncEngine.create builds the LLMEngine on the step thread
too, so that loading the model starts no OpenMP pool on the caller's thread.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from loraloom.engine.lora.host_cache import AdapterFetcher, fetch_local_dir
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.client import EngineFacts
from loraloom.engine.generation_defaults import read_generation_defaults
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.outputs import AdapterResidency, EngineStats, RequestFailedError, RequestOutput
from loraloom.engine.request import SamplingParams
from loraloom.engine.structured_output import CompiledGrammar
from loraloom.engine.tenancy import DEFAULT_TENANT, TenantTag
from loraloom.engine.torch_threads import StepThread, one_torch_thread

# Schemas compile on their own thread, never on the step thread; one at a time, so that a burst of
# new schemas takes one core and not every core the step needs. What a compile may cost is bounded
# by its fuel (engine/structured_output.py); this wait is the bound as the client sees it.
GRAMMAR_COMPILE_TIMEOUT_S = 10.0

logger = logging.getLogger(__name__)

# (request id, prompt, params, adapter, tenant, cache salt, arrival time: time.monotonic() when generate()
# was called)
PendingAdd = tuple[str, list[int], SamplingParams, AdapterHandle | None, TenantTag, str | None, float]


class AsyncEngine:
    """The engine in this process; implements EngineClient (engine/client.py)."""

    def __init__(self, engine: LLMEngine, step_thread: StepThread | None = None) -> None:
        """`step_thread`: the thread the engine was built on (create() passes it); else a new one."""
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.config = engine.config
        self.model_name = engine.model_dir.name
        self.max_model_len = engine.max_model_len
        self.max_lora_rank = engine.config.max_lora_rank
        self.device = engine.config.device
        self.generation_defaults = read_generation_defaults(engine.model_dir, engine.config.generation_config)
        # Adapter fetches may be slow (object storage); they must not hold up the step thread.
        self._fetch_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="loraloom-fetch",
                                                 initializer=one_torch_thread)
        self._grammar_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loraloom-grammar",
                                                  initializer=one_torch_thread)
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}  # touched on the loop only
        # Shared with the step thread, under _lock: what the loop asks it to do between steps.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._pending_adds: list[PendingAdd] = []
        self._pending_aborts: list[str] = []
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_thread = step_thread or StepThread("loraloom-step")
        self._stepping: Future | None = None  # _step_forever running on the step thread

    @classmethod
    def create(
        cls, model_dir: Path, config: EngineConfig, adapter_fetch: AdapterFetcher = fetch_local_dir
    ) -> "AsyncEngine":
        """The engine built on its own step thread (raises what LLMEngine raises)."""
        step_thread = StepThread("loraloom-step")
        try:
            engine = step_thread.submit(LLMEngine, model_dir, config, adapter_fetch).result()
        except BaseException:
            step_thread.stop()
            raise
        return cls(engine, step_thread)

    async def start(self) -> None:
        if self._stepping is None:
            self._loop = asyncio.get_running_loop()
            self._stopping = False
            self._stepping = self._step_thread.submit(self._step_forever)

    async def shutdown(self) -> None:
        if self._stepping is not None:
            with self._work:
                self._stopping = True
                self._work.notify()
            await asyncio.wrap_future(self._stepping)
            self._stepping = None
        self._step_thread.stop()
        self._fetch_threads.shutdown(wait=True)
        self._grammar_thread.shutdown(wait=True)

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch and validate into the host cache off the step thread; raises AdapterLoadError."""
        await asyncio.get_running_loop().run_in_executor(self._fetch_threads, self.engine.load_adapter, adapter)

    async def _hold_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch and hold the adapter's host-cache entry off the step thread, for the request about to
        be queued; a caller cancelled meanwhile gives the hold back once the fetch ends."""
        holding = self._fetch_threads.submit(self.engine.hold_adapter, adapter)
        try:
            await asyncio.wrap_future(holding)
        except asyncio.CancelledError:
            holding.add_done_callback(
                lambda done: None if done.cancelled() or done.exception() is not None
                else self.engine.release_adapter(adapter.key)
            )
            raise

    async def compile_grammar(self, schema: dict | str | None) -> CompiledGrammar:
        """A JSON schema's grammar (None: any JSON object) for SamplingParams.grammar, compiled off the
        step thread (cached by schema text). Raises ValueError naming response_format."""
        compiling = asyncio.get_running_loop().run_in_executor(self._grammar_thread, self.engine.compile_grammar, schema)
        try:
            return await asyncio.wait_for(compiling, GRAMMAR_COMPILE_TIMEOUT_S)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            raise ValueError(f"response_format: the JSON schema took over {GRAMMAR_COMPILE_TIMEOUT_S:g} s to "
                             "compile; simplify it") from None

    def unload_adapter(self, key: str) -> None:
        """Forget an adapter's host copy (thread-safe: the cache has its own lock)."""
        self.engine.unload_adapter(key)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def facts(self) -> EngineFacts:
        return EngineFacts(model_name=self.model_name, max_model_len=self.max_model_len,
                           max_lora_rank=self.max_lora_rank, model_config=self.model_config,
                           device=self.device, generation_defaults=self.generation_defaults)

    def adapter_residency(self) -> AdapterResidency:
        """Read off the step thread: the slot table and cache change under it, so a read that races a
        change ("dictionary changed size during iteration") is retried."""
        core = self.engine
        cache = core.adapter_cache

        def read() -> AdapterResidency:
            return AdapterResidency(
                slots={key: core.slot_table.lookup(key) for key in core.slot_table.resident_keys()},
                host_cache_keys=frozenset(cache.keys()),
            )

        for _ in range(10):
            try:
                return read()
            except RuntimeError:
                continue
        return read()

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
        """Stream a request's outputs. Errors in the request surface at the first iteration.
        `tenant` (None: DEFAULT_TENANT) scopes its prefix cache and fair share and labels its stats; it
        grants nothing (the gateway authorized the adapter). `cache_salt` isolates it within the tenant."""
        arrival_time = time.monotonic()  # latency metrics count the adapter fetch and the queue too
        if request_id in self._streams:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.engine.validate_request(prompt_token_ids, params)
        if adapter is not None:
            await self._hold_adapter(adapter)  # no await from here to _submit: the hold reaches the request
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self._submit(adds=[(request_id, list(prompt_token_ids), params, adapter, tenant or DEFAULT_TENANT, cache_salt,
                            arrival_time)])
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the caller went away (disconnect, cancel): free its blocks and slot
                self._submit(aborts=[request_id])

    def _submit(self, adds: Iterable[PendingAdd] = (), aborts: Iterable[str] = ()) -> None:
        """Queue work for the step thread and wake it (called on the loop)."""
        with self._work:
            self._pending_adds.extend(adds)
            self._pending_aborts.extend(aborts)
            self._work.notify()

    def _step_forever(self) -> None:
        """The step thread: wait for work, apply queued adds/aborts, step, hand the outputs over; again."""
        while True:
            with self._work:
                while not (self._stopping or self._pending_adds or self._pending_aborts or self.engine.has_unfinished()):
                    self._work.wait()
                if self._stopping:
                    return
                adds, self._pending_adds = self._pending_adds, []
                aborts, self._pending_aborts = self._pending_aborts, []
            try:
                outputs, failures = self._step(adds, aborts)
            except Exception as exc:  # a bug in a step must not kill the server: fail the running requests
                logger.exception("engine step failed")
                self._loop.call_soon_threadsafe(self._fail_all, RuntimeError(f"engine step failed: {exc}"))
                continue
            if outputs or failures:
                self._loop.call_soon_threadsafe(self._dispatch, outputs, failures)

    def _dispatch(self, outputs: list[RequestOutput], failures: list[tuple[str, Exception]]) -> None:
        """On the loop: each output or error to its request's stream (gone if the client left)."""
        for request_id, error in failures:
            queue = self._streams.get(request_id)
            if queue is not None:
                queue.put_nowait(error)
        for output in outputs:
            queue = self._streams.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output if output.error is None else RequestFailedError(output.error))

    def _fail_all(self, error: Exception) -> None:
        """On the loop: fail every open stream and abort its request (a failed step may have left them half-done)."""
        for request_id, queue in list(self._streams.items()):
            queue.put_nowait(error)
        self._submit(aborts=list(self._streams))

    def _step(self, adds: list[PendingAdd], aborts: list[str]) -> tuple[list[RequestOutput], list[tuple[str, Exception]]]:
        """Runs on the step thread: apply queued adds/aborts, then one engine step."""
        failures: list[tuple[str, Exception]] = []
        for request_id in aborts:
            self.engine.abort_request(request_id)
        for request_id, prompt, params, adapter, tenant, cache_salt, arrival_time in adds:
            if request_id in aborts:  # gone before admission: give back the hold generate() took
                if adapter is not None:
                    self.engine.release_adapter(adapter.key)
                continue
            try:
                self.engine.add_request(request_id, prompt, params, adapter, tenant, cache_salt,
                                        arrival_time=arrival_time, prepared=True)
            except Exception as exc:  # validated before queueing; a late failure reaches only its stream
                failures.append((request_id, exc))
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        return outputs, failures
