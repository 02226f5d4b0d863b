"""AsyncEngine: the step thread keeps stepping while the event loop hands outputs to streams.

The tiny random tiny_checkpoint (with the bundled tokenizer) keeps these fast; what is checked is the threading: concurrent
streams get exactly what the synchronous engine produces, a client that goes away frees its KV
blocks while others keep running, a failing step fails only the open streams and the engine
goes on, and shutdown stops the thread.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lora_factory import make_peft_adapter

from loraloom.engine import AdapterHandle
from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.outputs import RequestFailedError
from loraloom.engine.request import SamplingParams

CONFIG = EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=64)
PROMPTS = [[(11 * i + j) % 300 + 10 for j in range(5 + i)] for i in range(6)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def synchronous_tokens(tiny_checkpoint: Path, max_tokens: list[int]) -> dict[str, list[int]]:
    engine = LLMEngine(tiny_checkpoint, CONFIG)
    for i, (prompt, budget) in enumerate(zip(PROMPTS, max_tokens)):
        engine.add_request(f"r{i}", prompt, greedy(budget))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id] += output.token_ids
    return tokens


async def collect(engine: AsyncEngine, request_id: str, prompt: list[int], params: SamplingParams) -> list[int]:
    tokens: list[int] = []
    async for output in engine.generate(request_id=request_id, prompt_token_ids=prompt, params=params, adapter=None):
        tokens += output.token_ids
    return tokens


@pytest.fixture
def engine(tiny_checkpoint):
    return AsyncEngine(LLMEngine(tiny_checkpoint, CONFIG))


def test_concurrent_streams_get_what_the_synchronous_engine_makes(engine, tiny_checkpoint):
    budgets = [3, 9, 1, 14, 6, 11]  # requests finish at different steps while others run on

    async def run():
        await engine.start()
        try:
            results = await asyncio.gather(*(collect(engine, f"r{i}", prompt, greedy(budget))
                                             for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets))))
        finally:
            await engine.shutdown()
        return {f"r{i}": tokens for i, tokens in enumerate(results)}

    assert asyncio.run(run()) == synchronous_tokens(tiny_checkpoint, budgets)
    assert engine._stepping is None  # shutdown waited for the step loop to end


def test_a_client_that_goes_away_frees_its_blocks_while_others_finish(engine):
    async def leave_after_two(request_id: str) -> None:
        stream = engine.generate(request_id=request_id, prompt_token_ids=PROMPTS[0], params=greedy(200), adapter=None)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.aclose()  # what the server does when the HTTP client disconnects

    async def run():
        await engine.start()
        try:
            _, finished = await asyncio.gather(leave_after_two("gone"), collect(engine, "stays", PROMPTS[1], greedy(20)))
            for _ in range(1000):  # the abort is applied by the step thread between steps
                if not engine.engine.has_unfinished():
                    break
                await asyncio.sleep(0.01)
            return finished
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 20
    manager = engine.engine.block_manager
    manager.check_invariants()
    assert manager.num_used_blocks == 0 and not engine.engine.has_unfinished()


def test_a_failing_step_fails_open_streams_and_the_engine_goes_on(engine, monkeypatch):
    real_step = engine.engine.step
    calls = {"n": 0}

    def step_that_fails_once():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(engine.engine, "step", step_that_fails_once)

    async def run():
        await engine.start()
        try:
            with pytest.raises(RuntimeError, match="engine step failed: boom"):
                await collect(engine, "victim", PROMPTS[0], greedy(50))
            return await collect(engine, "after", PROMPTS[2], greedy(4))
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 4
    assert engine.engine.block_manager.num_used_blocks == 0


def test_a_request_failed_by_the_engine_raises_in_its_own_stream_only(engine, monkeypatch):
    """An output with finish_reason "error" (LLMEngine fails a request whose logits are not finite)
    reaches its stream as RequestFailedError with the engine's message; the stream beside it finishes."""
    real_step = engine.engine.step

    def step_failing_victim():
        outputs = real_step()
        for output in outputs:
            if output.request_id == "victim":
                engine.engine.abort_request("victim")
                output.token_ids, output.finished, output.finish_reason = [], True, "error"
                output.error = "generation failed: non-finite values"
        return outputs

    monkeypatch.setattr(engine.engine, "step", step_failing_victim)

    async def run():
        await engine.start()
        try:
            victim = asyncio.ensure_future(collect(engine, "victim", PROMPTS[0], greedy(6)))
            survivor = await collect(engine, "survivor", PROMPTS[1], greedy(6))
            with pytest.raises(RequestFailedError, match="non-finite values"):
                await victim
            return survivor
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 6
    assert engine.engine.block_manager.num_used_blocks == 0


def test_a_request_reads_its_adapter_from_the_host_cache_once_and_gives_its_hold_back(
    engine, tiny_checkpoint, tmp_path
):
    """Issue 11: generate() used to read the host cache before queueing, and the step thread read it again to admit.
    Now the hold taken off the step thread is the request's: one lookup (a miss, then nothing)."""
    directory = make_peft_adapter(tiny_checkpoint, tmp_path / "a", rank=4, alpha=8,
                                  target_modules=["q_proj", "v_proj"], seed=5)
    adapter = AdapterHandle(key="a@test", name="a", uri=directory.as_uri())
    cache = engine.engine.adapter_cache

    async def run() -> list[int]:
        tokens: list[int] = []
        await engine.start()
        try:
            async for output in engine.generate(request_id="r", prompt_token_ids=PROMPTS[0], params=greedy(4),
                                                adapter=adapter):
                tokens += output.token_ids
        finally:
            await engine.shutdown()
        return tokens

    assert len(asyncio.run(run())) == 4
    assert (cache.hits, cache.misses) == (0, 1)
    with pytest.raises(KeyError):
        cache.held(adapter.key)  # the request's end gave the hold back
