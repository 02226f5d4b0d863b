"""AsyncEngine: the step loop in the background, one async stream per request.

All LLMEngine calls run on a single worker thread, so the engine itself needs
no locks and the event loop stays free to serve HTTP while a step computes.
Adds and aborts are queued and applied by that thread between steps.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loraloom.engine.adapter_cache import AdapterFetcher, fetch_local_dir
from loraloom.engine.adapters import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.engine import LLMEngine
from loraloom.engine.outputs import EngineStats, RequestOutput
from loraloom.engine.request import SamplingParams

logger = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.config = engine.config
        self.model_name = engine.model_dir.name
        self.max_model_len = engine.max_model_len
        self._step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loraloom-step")
        # Adapter fetches may be slow (object storage); they must not hold up the step thread.
        self._fetch_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="loraloom-fetch")
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._pending_adds: list[tuple[str, list[int], SamplingParams, AdapterHandle | None]] = []
        self._pending_aborts: list[str] = []
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    @classmethod
    def create(
        cls, model_dir: Path, config: EngineConfig, adapter_fetch: AdapterFetcher = fetch_local_dir
    ) -> "AsyncEngine":
        return cls(LLMEngine(model_dir, config, adapter_fetch))

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run_loop(), name="loraloom-engine-loop")

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
        self._step_thread.shutdown(wait=True)
        self._fetch_threads.shutdown(wait=True)

    async def load_adapter(self, adapter: AdapterHandle) -> None:
        """Fetch and validate into the host cache off the step thread; raises AdapterLoadError."""
        await asyncio.get_running_loop().run_in_executor(self._fetch_threads, self.engine.load_adapter, adapter)

    def unload_adapter(self, key: str) -> None:
        """Forget an adapter's host copy (thread-safe: the cache has its own lock)."""
        self.engine.unload_adapter(key)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter: AdapterHandle | None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Errors in the request surface at the first iteration."""
        if request_id in self._streams:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.engine.validate_request(prompt_token_ids, params)
        if adapter is not None:
            await self.load_adapter(adapter)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self._pending_adds.append((request_id, list(prompt_token_ids), params, adapter))
        self._wakeup.set()
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
                self._pending_aborts.append(request_id)
                self._wakeup.set()

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending_adds and not self._pending_aborts and not self.engine.has_unfinished():
                await self._wakeup.wait()
            self._wakeup.clear()
            adds, self._pending_adds = self._pending_adds, []
            aborts, self._pending_aborts = self._pending_aborts, []
            try:
                outputs, failures = await loop.run_in_executor(self._step_thread, self._step, adds, aborts)
            except Exception as exc:  # a bug in a step must not kill the server: fail the running requests
                logger.exception("engine step failed")
                for request_id, queue in list(self._streams.items()):
                    queue.put_nowait(RuntimeError(f"engine step failed: {exc}"))
                    self._pending_aborts.append(request_id)
                continue
            for request_id, error in failures:
                queue = self._streams.get(request_id)
                if queue is not None:
                    queue.put_nowait(error)
            for output in outputs:
                queue = self._streams.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)

    def _step(self, adds, aborts) -> tuple[list[RequestOutput], list[tuple[str, Exception]]]:
        """Runs on the step thread: apply queued adds/aborts, then one engine step."""
        failures: list[tuple[str, Exception]] = []
        for request_id in aborts:
            self.engine.abort_request(request_id)
        for request_id, prompt, params, adapter in adds:
            if request_id in aborts:
                continue
            try:
                self.engine.add_request(request_id, prompt, params, adapter)
            except Exception as exc:  # validated before queueing; a late failure reaches only its stream
                failures.append((request_id, exc))
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        return outputs, failures
