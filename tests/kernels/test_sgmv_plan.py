"""The host-side SGMV plan (kernels/sgmv_plan.py): segments, row tiles, padding, the packed layout.

Checked against a plain loop over the tokens (the oracle) and against the plan's own
invariants, on named mixes of adapters, base tokens and empty slots.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from loraloom.kernels.sgmv_plan import SGMVLayout, metadata_views, plan_sgmv, segment_capacity, tile_capacity


def _grouping_by_loop(token_slots: list[int], tile_rows: int) -> dict[str, list[int]]:
    """The oracle: segments by ascending slot (batch order inside), then each segment's row tiles."""
    groups = {"sorted_ids": [], "starts": [], "lens": [], "slots": [], "tile_segments": [], "tile_row_starts": []}
    for slot in sorted(set(token_slots) - {-1}):
        rows = [row for row, s in enumerate(token_slots) if s == slot]
        segment = len(groups["slots"])
        groups["starts"].append(len(groups["sorted_ids"]))
        groups["sorted_ids"] += rows
        groups["lens"].append(len(rows))
        groups["slots"].append(slot)
        for first_row in range(0, len(rows), tile_rows):
            groups["tile_segments"].append(segment)
            groups["tile_row_starts"].append(first_row)
    return groups


def _mix(name: str) -> tuple[list[int], list[int]]:
    """(token_slots, slot_ranks) of a named mix; slots left empty sit between used ones."""
    rng = random.Random(name)
    ranks8 = [4, 8, 16, 64, 4, 8, 16, 64]
    ranks64 = [rng.choice([8, 16, 32, 64]) for _ in range(64)]
    return {
        "all_distinct": ([5, 2, 7, 0, 3, 1, 6, 4], ranks8),
        "one_adapter": ([3] * 9, ranks8),
        "one_slot_long": ([6] * 53, ranks8),  # 4 tiles, a ragged last one
        "whole_tiles": ([1] * 32 + [-1] + [4] * 16, ranks8),  # segments that end exactly on a tile boundary
        "skewed": ([6] * 40 + [1] + [-1] * 3 + [2], ranks8),
        "interleaved": ([0, -1, 2, 0, 2, -1, 0, 7, 2, 7], ranks8),
        "zipf": ([min(int(rng.paretovariate(1.0)) - 1, 7) for _ in range(64)], ranks8),
        "with_base": ([rng.choice([-1, -1, 4, 5]) for _ in range(33)], ranks8),
        "64_slots_decode": (rng.sample(range(64), 64), ranks64),
        "64_slots_uneven": ([rng.randrange(64) if rng.random() < 0.9 else -1 for _ in range(256)], ranks64),
        "all_base": ([-1] * 7, ranks8),
    }[name]


MIX_NAMES = ["all_distinct", "one_adapter", "one_slot_long", "whole_tiles", "skewed", "interleaved", "zipf",
             "with_base", "64_slots_decode", "64_slots_uneven", "all_base"]


@pytest.mark.parametrize("tile_rows", [16, 32])
@pytest.mark.parametrize("mix", MIX_NAMES)
def test_sgmv_plan_groups_and_tiles_like_a_loop(mix, tile_rows):
    token_slots, slot_ranks = _mix(mix)
    plan = plan_sgmv(np.array(token_slots), slot_ranks, tile_rows=tile_rows)
    meta = plan.to_metadata("cpu")
    oracle = _grouping_by_loop(token_slots, tile_rows)
    lora_tokens = len(oracle["sorted_ids"])
    assert meta.sorted_token_ids.tolist()[:lora_tokens] == oracle["sorted_ids"]
    assert meta.sorted_token_ids.shape[0] == len(token_slots)  # room for every token of the batch
    assert meta.segment_starts.tolist() == meta.segment_starts_host == oracle["starts"]
    assert meta.segment_lens.tolist() == meta.segment_lens_host == oracle["lens"]
    assert meta.active_slots.tolist() == meta.active_slots_host == oracle["slots"]
    assert meta.tile_segments.tolist() == oracle["tile_segments"]
    assert meta.tile_row_starts.tolist() == oracle["tile_row_starts"]
    assert meta.token_to_slot.tolist() == token_slots
    assert meta.slot_ranks.tolist() == meta.slot_ranks_host == slot_ranks
    runs = [rows[0] if rows == list(range(rows[0], rows[0] + len(rows))) else -1
            for rows in (oracle["sorted_ids"][start:start + length] for start, length in zip(oracle["starts"], oracle["lens"]))]
    assert meta.segment_rows_host == runs
    assert meta.num_segments == plan.num_segments == len(oracle["slots"])
    assert meta.tile_rows == tile_rows
    assert all(getattr(meta, name).dtype == torch.int32 for name in SGMVLayout.FIELDS)


@pytest.mark.parametrize("mix", ["skewed", "64_slots_uneven", "all_base"])
def test_sgmv_plan_padded_to_capacities(mix):
    """Padded like a CUDA-graph batch: the real part equals the exact plan, the rest is inert padding."""
    token_slots, slot_ranks = _mix(mix)
    exact = plan_sgmv(token_slots, slot_ranks)
    max_segments = segment_capacity(len(token_slots), len(slot_ranks))
    max_tiles = tile_capacity(len(token_slots), max_segments)
    padded = plan_sgmv(token_slots, slot_ranks, max_segments=max_segments, max_tiles=max_tiles)
    a, n = exact.num_segments, exact.num_tiles
    assert (padded.num_segments, padded.num_tiles) == (a, n)
    for name in ("segment_starts", "segment_lens", "active_slots"):
        assert padded.field(name).shape == (max_segments,)
        assert padded.field(name)[:a].tolist() == exact.field(name).tolist()
    assert padded.field("segment_lens")[a:].tolist() == [0] * (max_segments - a)
    assert padded.field("active_slots")[a:].tolist() == [-1] * (max_segments - a)
    assert padded.field("tile_segments").tolist() == exact.field("tile_segments").tolist() + [-1] * (max_tiles - n)
    assert padded.field("tile_row_starts")[:n].tolist() == exact.field("tile_row_starts").tolist()
    assert padded.field("sorted_token_ids").tolist() == exact.field("sorted_token_ids").tolist()


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
@pytest.mark.parametrize("mix", MIX_NAMES)
def test_sgmv_plan_tiles_cover_every_adapter_token_once(mix, padded):
    """What the kernels rely on, from the plan's fields alone: the real tiles, walked the way a
    kernel walks them, reach every adapter token exactly once and under its own slot; base tokens
    and padding tiles reach nothing."""
    token_slots, slot_ranks = _mix(mix)
    capacities = {}
    if padded:
        max_segments = segment_capacity(len(token_slots), len(slot_ranks))
        capacities = dict(max_segments=max_segments, max_tiles=tile_capacity(len(token_slots), max_segments))
    plan = plan_sgmv(token_slots, slot_ranks, **capacities)
    starts, lens = plan.field("segment_starts"), plan.field("segment_lens")
    slots, sorted_rows = plan.field("active_slots"), plan.field("sorted_token_ids")
    reached = []
    for segment, row_start in zip(plan.field("tile_segments"), plan.field("tile_row_starts")):
        if segment == -1:
            continue
        assert 0 <= row_start < lens[segment] and row_start % plan.layout.tile_rows == 0
        for offset in range(row_start, min(row_start + plan.layout.tile_rows, lens[segment])):
            row = int(sorted_rows[starts[segment] + offset])
            assert token_slots[row] == slots[segment]
            reached.append(row)
    assert sorted(reached) == [row for row, slot in enumerate(token_slots) if slot != -1]
    assert (plan.field("tile_segments") != -1).sum() == plan.num_tiles


def test_sgmv_packed_buffer_views_follow_the_layout():
    token_slots, slot_ranks = _mix("interleaved")
    plan = plan_sgmv(token_slots, slot_ranks, max_segments=6, max_tiles=7)
    layout = plan.layout
    assert plan.packed.dtype == np.int32 and plan.packed.shape == (layout.size,)
    assert layout.size == 2 * len(token_slots) + 3 * 6 + 2 * 7 + len(slot_ranks)
    expected = np.concatenate([plan.field(name) for name in SGMVLayout.FIELDS])
    assert np.array_equal(plan.packed, expected)  # fields are consecutive, in FIELDS order

    # The CUDA-graph pattern: one static buffer, metadata built once as views, refreshed by one copy.
    static = torch.zeros(layout.size, dtype=torch.int32)
    meta = metadata_views(static, plan)
    other = plan_sgmv([7, 7, -1, 0, 2, 2, 2, 0, -1, 7], slot_ranks, max_segments=6, max_tiles=7)
    static.copy_(torch.from_numpy(other.packed))
    fresh = other.to_metadata("cpu")
    for name in SGMVLayout.FIELDS:
        assert torch.equal(getattr(meta, name), getattr(fresh, name)), name
        assert getattr(meta, name).data_ptr() >= static.data_ptr()  # a view, not a copy
    with pytest.raises(ValueError, match="SGMVLayout.size"):
        metadata_views(torch.zeros(layout.size + 1, dtype=torch.int32), plan)


def _most_tiles_by_enumeration(num_tokens: int, max_segments: int, tile_rows: int) -> int:
    """max over every way of putting <= num_tokens tokens in <= max_segments non-empty segments."""
    best = 0

    def place(tokens_left: int, segments_left: int, tiles: int, smallest: int) -> None:
        nonlocal best
        best = max(best, tiles)
        if segments_left == 0:
            return
        for length in range(smallest, tokens_left + 1):  # non-decreasing lengths: each multiset once
            place(tokens_left - length, segments_left - 1, tiles + -(-length // tile_rows), length)

    place(num_tokens, max_segments, 0, 1)
    return best


def test_tile_capacity_is_the_exact_bound():
    for tile_rows in (1, 2, 3, 4):
        for num_tokens in range(0, 13):
            for max_segments in range(0, 6):
                assert tile_capacity(num_tokens, max_segments, tile_rows) == _most_tiles_by_enumeration(
                    num_tokens, max_segments, tile_rows), (tile_rows, num_tokens, max_segments)


def test_tile_capacity_bounds_real_plans_and_is_reached():
    rng = random.Random(5)
    for _ in range(200):
        num_tokens, num_slots = rng.randrange(1, 300), rng.randrange(1, 80)
        token_slots = [rng.randrange(-1, num_slots) for _ in range(num_tokens)]
        plan = plan_sgmv(token_slots, [16] * num_slots)
        assert plan.num_tiles <= tile_capacity(num_tokens, segment_capacity(num_tokens, num_slots))
    # The worst case: 63 one-token segments and one segment of the other 193 tokens.
    worst = list(range(63)) + [63] * 193
    assert plan_sgmv(worst, [16] * 64).num_tiles == tile_capacity(256, 64) == 63 + 13


def test_sgmv_plan_refuses_overflowing_capacities():
    with pytest.raises(ValueError, match="needs 3 segments but segments capacity is 2"):
        plan_sgmv([0, 1, 2], [8, 8, 8], max_segments=2)
    with pytest.raises(ValueError, match="needs 2 tiles but tiles capacity is 1"):
        plan_sgmv([0] * 17, [8], max_tiles=1)
    with pytest.raises(ValueError, match="tile_rows must be a power of two"):
        plan_sgmv([0], [8], tile_rows=24)
