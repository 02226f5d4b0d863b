"""engine/step_batch.py: the vectorized flattening of a step equals a plain per-token loop."""
from __future__ import annotations

import random

import numpy as np
import pytest

from loraloom.engine.block_rows import BlockRows
from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.scheduler import ScheduledRequest, SchedulerOutput
from loraloom.engine.step_batch import flatten_step

BLOCK_SIZE = 4


def loop_oracle(step: SchedulerOutput, block_size: int) -> dict[str, list]:
    """What the runner used to build, one token at a time."""
    out = {name: [] for name in ("input_ids", "positions", "slot_mapping", "token_slots", "seq_lens", "logits_rows")}
    query_start_loc = [0]
    for item in step.scheduled:
        request = item.request
        start, end = request.num_computed_tokens, request.num_computed_tokens + item.num_new_tokens
        out["input_ids"] += request.all_token_ids[start:end]
        for position in range(start, end):
            out["positions"].append(position)
            out["slot_mapping"].append(request.block_ids[position // block_size] * block_size + position % block_size)
            out["token_slots"].append(item.slot)
        query_start_loc.append(query_start_loc[-1] + item.num_new_tokens)
        out["seq_lens"].append(end)
        if item.sample:
            out["logits_rows"].append(query_start_loc[-1] - 1)
    out["query_start_loc"] = query_start_loc
    return out


def random_step(rng: random.Random, count: int) -> SchedulerOutput:
    scheduled = []
    for index in range(count):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 30))]
        request = Request(request_id=f"r{index}", prompt_token_ids=prompt,
                          sampling_params=SamplingParams(max_tokens=50), arrival_order=index)
        request.output_token_ids = [rng.randrange(1000) for _ in range(rng.randint(0, 5))]
        total = len(prompt) + len(request.output_token_ids)
        request.num_computed_tokens = rng.randint(0, total - 1)
        num_new = rng.randint(1, total - request.num_computed_tokens)
        blocks_needed = -(-(request.num_computed_tokens + num_new) // BLOCK_SIZE)
        request.block_ids = rng.sample(range(500), blocks_needed + rng.randint(0, 2))
        done = request.num_computed_tokens + num_new == total
        scheduled.append(ScheduledRequest(request, num_new, rng.choice([-1, 0, 3]), sample=done))
    rows = BlockRows.of(item.request for item in scheduled)
    return SchedulerOutput(scheduled=scheduled, adapter_loads=[], preempted_ids=[],
                           num_batched_tokens=sum(item.num_new_tokens for item in scheduled), block_table=rows.array)


@pytest.mark.parametrize("seed", range(20))
def test_flatten_matches_the_per_token_loop(seed):
    rng = random.Random(seed)
    step = random_step(rng, rng.randint(1, 12))
    batch = flatten_step(step, BLOCK_SIZE)
    expected = loop_oracle(step, BLOCK_SIZE)
    for name, values in expected.items():
        assert getattr(batch, name).tolist() == values, name
    # Each row: the blocks the request reads this step (it may hold more), then zeros.
    assert batch.block_tables.shape[1] == -(-max(expected["seq_lens"]) // BLOCK_SIZE)
    for row, item in enumerate(step.scheduled):
        blocks = item.request.block_ids[:batch.block_tables.shape[1]]
        assert batch.block_tables[row, :len(blocks)].tolist() == blocks
        assert not batch.block_tables[row, len(blocks):].any()
    assert batch.input_ids.dtype == np.int64 and batch.slot_mapping.dtype == np.int64
    assert batch.query_start_loc.dtype == np.int32 and batch.block_tables.dtype == np.int32


def test_decode_shape_is_recognized():
    rng = random.Random(0)
    step = random_step(rng, 6)
    for item in step.scheduled:  # one new token each, sampled: a plain decode step
        item.num_new_tokens = 1
        item.request.num_computed_tokens = item.request.num_tokens - 1
        item.sample = True
    assert flatten_step(step, BLOCK_SIZE).is_decode
    step.scheduled[2].sample = False
    assert not flatten_step(step, BLOCK_SIZE).is_decode
