"""n choices below the HTTP layer: one engine request per choice over one prompt, the later choices
reading the first one's prompt from the prefix cache, one usage row for them all, and closing the
stream aborting every choice. A real AsyncEngine on the tiny checkpoint and a real usage writer."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

from loraloom.engine import AsyncEngine, SamplingParams
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.platform.accounts.keys import Caller
from loraloom.platform.api.generation.choices import open_generation
from loraloom.platform.api.generation.sampling import choice_params
from loraloom.platform.metering.batch_writer import BatchWriter
from loraloom.platform.metering.usage import UsageMeter

BLOCK_SIZE = 4
CONFIG = EngineConfig(num_kv_blocks=64, block_size=BLOCK_SIZE, max_num_batched_tokens=64)
PROMPT = list(range(10, 33))  # 23 tokens: 5 full blocks
CHOICES = 4


async def run_choices(engine: AsyncEngine, rows: list[dict], outputs_to_read: int | None = None):
    """Open CHOICES seeded choices; read every output (or only the first `outputs_to_read`, then close)."""
    writer = BatchWriter(rows.extend, name="usage", flush_interval_s=0.01, max_batch=10, max_pending=10)
    writer.start()
    caller = Caller(tenant_id=uuid.uuid4(), api_key_id=uuid.uuid4(), role="inference")
    meter = UsageMeter(writer=writer, caller=caller, endpoint="completions")
    params = choice_params(SamplingParams(max_tokens=5, temperature=1.0, seed=3, ignore_eos=True), CHOICES)
    by_choice = defaultdict(list)
    try:
        outputs = await open_generation(engine, request_id="req", prompt_token_ids=PROMPT, params=params,
                                        adapter=None, model="base", meter=meter)
        async for index, output in outputs:
            by_choice[index].append(output)
            if outputs_to_read is not None and sum(map(len, by_choice.values())) == outputs_to_read:
                break
        await outputs.aclose()
    finally:
        await writer.close()
    return by_choice


def test_later_choices_read_the_prompt_from_the_prefix_cache_and_usage_counts_it_once(tiny_checkpoint):
    engine = AsyncEngine(LLMEngine(tiny_checkpoint, CONFIG))
    rows: list[dict] = []

    async def run():
        await engine.start()
        try:
            return await run_choices(engine, rows)
        finally:
            await engine.shutdown()

    by_choice = asyncio.run(run())
    assert sorted(by_choice) == list(range(CHOICES))
    assert by_choice[0][0].num_cached_tokens == 0
    full_blocks = len(PROMPT) // BLOCK_SIZE * BLOCK_SIZE
    assert [by_choice[index][0].num_cached_tokens for index in range(1, CHOICES)] == [full_blocks] * (CHOICES - 1)
    assert all(outputs[-1].num_output_tokens == 5 for outputs in by_choice.values())
    tokens = [[token for output in outputs for token in output.token_ids] for outputs in by_choice.values()]
    assert len({tuple(t) for t in tokens}) > 1, "seeds + i: the choices differ"
    [row] = rows
    assert (row["status"].value, row["prompt_tokens"], row["completion_tokens"]) == ("ok", len(PROMPT), 5 * CHOICES)


def test_closing_the_stream_aborts_every_choice(tiny_checkpoint):
    engine = AsyncEngine(LLMEngine(tiny_checkpoint, CONFIG))
    rows: list[dict] = []

    async def run():
        await engine.start()
        try:
            await run_choices(engine, rows, outputs_to_read=2)
            deadline = time.monotonic() + 60
            while engine.stats().num_running or engine.stats().kv_blocks_used:  # the aborts reach the step thread
                assert time.monotonic() < deadline, "the choices were not aborted"
                await asyncio.sleep(0.01)
        finally:
            await engine.shutdown()

    asyncio.run(run())
    [row] = rows
    assert row["status"].value == "aborted"
