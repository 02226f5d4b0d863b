"""Triton SGMV shrink/expand (interpreted on the CPU) against kernels/reference.py in fp64.

Weights and activations carry NaN wherever a slot's rank ends, so any read past a slot's own
rank poisons the result; out and base_out start from known values, so rows and columns the
kernels must leave alone are checked too.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from loraloom.kernels import reference, sgmv
from sgmv_cases import MAX_RANK, MIXES, SLOT_RANKS, adapter_mix, sgmv_metadata

NUM_TOKENS = 40
IN_FEATURES = 200  # not a multiple of the 64-wide K step
OUT_FEATURES = [72, 24, 40]  # q/k/v-like slices, none a multiple of the 64-wide N tile
TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def nan_past_rank(weight: torch.Tensor, rank_dim: int) -> torch.Tensor:
    """Fill each slot's rows/columns beyond its rank with NaN."""
    for slot, rank in enumerate(SLOT_RANKS):
        weight[slot].narrow(rank_dim - 1, rank, MAX_RANK - rank).fill_(float("nan"))
    return weight


def lora_a_slices(num_slices: int, dtype: torch.dtype, generator: torch.Generator) -> list[torch.Tensor]:
    slots = len(SLOT_RANKS)
    weights = [torch.randn(slots, MAX_RANK, IN_FEATURES, generator=generator) / IN_FEATURES ** 0.5
               for _ in range(num_slices)]
    return [nan_past_rank(w.to(dtype), rank_dim=1) for w in weights]  # [S, R, in]


def lora_b_slices(dtype: torch.dtype, generator: torch.Generator) -> list[torch.Tensor]:
    weights = [torch.randn(len(SLOT_RANKS), out, MAX_RANK, generator=generator) / MAX_RANK ** 0.5
               for out in OUT_FEATURES]
    return [nan_past_rank(w.to(dtype), rank_dim=2) for w in weights]  # [S, out_i, R]


def fp64(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mix", MIXES)
def test_shrink_matches_reference(mix: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    meta = sgmv_metadata(adapter_mix(mix, NUM_TOKENS, seed=2), SLOT_RANKS)
    x = torch.randn(NUM_TOKENS, IN_FEATURES, generator=generator).to(dtype)  # [T, in]
    lora_a = lora_a_slices(3, dtype, generator)
    out = torch.full((3, NUM_TOKENS, MAX_RANK), -7.0, dtype=dtype)  # [slices, T, R]
    expected = out.double()
    reference.sgmv_shrink(x.double(), fp64(lora_a), meta, expected)

    sgmv.sgmv_shrink(x, lora_a, meta, out)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_shrink_split_k_paths_agree(split_k: int) -> None:
    """Direct store (split_k 1), and 64-wide K steps split two and three ways, the third split
    getting no K step at all (200 = 128 + 72 + 0)."""
    generator = torch.Generator().manual_seed(3)
    meta = sgmv_metadata(adapter_mix("skewed", NUM_TOKENS, seed=4), SLOT_RANKS)
    x = torch.randn(NUM_TOKENS, IN_FEATURES, generator=generator)
    lora_a = lora_a_slices(2, torch.float32, generator)
    out = torch.full((2, NUM_TOKENS, MAX_RANK), 3.0)
    expected = out.double()
    reference.sgmv_shrink(x.double(), fp64(lora_a), meta, expected)

    sgmv.sgmv_shrink(x, lora_a, meta, out, split_k=split_k, config=sgmv.ShrinkConfig(block_k=64))

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float32])


def test_split_k_heuristic_splits_decode_not_long_prefill() -> None:
    assert sgmv.choose_split_k(num_tiles=4, num_slices=3, in_features=4096) > 1
    assert sgmv.choose_split_k(num_tiles=512, num_slices=3, in_features=4096) == 1
    narrow = sgmv.ShrinkConfig(block_k=32, target_programs=10_000, max_split_k=64)
    assert sgmv.choose_split_k(num_tiles=1, num_slices=1, in_features=100, config=narrow) == 4  # K steps cap it
    assert sgmv.choose_split_k(num_tiles=1, num_slices=1, in_features=100,
                               config=dataclasses.replace(narrow, max_split_k=3)) == 3


def padded_case(mix: str, seed: int) -> tuple[list[int], object, object]:
    """A mix, its exact metadata, and metadata of the same step padded like a CUDA-graph batch:
    8 more batch rows (base), 3 padding segments and 5 padding tiles."""
    token_slots = adapter_mix(mix, NUM_TOKENS, seed=seed) + [-1] * 8
    exact = sgmv_metadata(token_slots, SLOT_RANKS)
    padded = sgmv_metadata(token_slots, SLOT_RANKS, extra_segments=3, extra_tiles=5)
    assert padded.tile_segments.shape[0] == exact.tile_segments.shape[0] + 5
    return token_slots, exact, padded


@pytest.mark.parametrize("mix", ["skewed", "zipf", "all_base"])
@pytest.mark.parametrize("split_k", [1, 3])
def test_padded_metadata_gives_identical_shrink(mix: str, split_k: int) -> None:
    generator = torch.Generator().manual_seed(11)
    token_slots, exact, padded = padded_case(mix, seed=12)
    x = torch.randn(len(token_slots), IN_FEATURES, generator=generator).half()
    lora_a = lora_a_slices(3, torch.float16, generator)
    outs = {}
    for name, meta in (("exact", exact), ("padded", padded)):
        outs[name] = torch.full((3, len(token_slots), MAX_RANK), -7.0, dtype=torch.float16)
        sgmv.sgmv_shrink(x, lora_a, meta, outs[name], split_k=split_k)
    expected = torch.full((3, len(token_slots), MAX_RANK), -7.0, dtype=torch.float64)
    reference.sgmv_shrink(x.double(), fp64(lora_a), padded, expected)

    assert torch.equal(outs["padded"], outs["exact"])
    torch.testing.assert_close(outs["padded"].double(), expected, **TOLERANCES[torch.float16])


@pytest.mark.parametrize("mix", ["skewed", "uniform"])
def test_padded_metadata_gives_identical_expand(mix: str) -> None:
    generator = torch.Generator().manual_seed(13)
    token_slots, exact, padded = padded_case(mix, seed=14)
    y = torch.randn(3, len(token_slots), MAX_RANK, generator=generator).half()
    lora_b = lora_b_slices(torch.float16, generator)
    offsets = [0, OUT_FEATURES[0], OUT_FEATURES[0] + OUT_FEATURES[1], sum(OUT_FEATURES)]
    base = torch.randn(len(token_slots), sum(OUT_FEATURES), generator=generator).half()
    outs = {}
    for name, meta in (("exact", exact), ("padded", padded)):
        outs[name] = base.clone()
        sgmv.sgmv_expand(y, lora_b, meta, outs[name], offsets)
    expected = base.double()
    reference.sgmv_expand(y.double(), fp64(lora_b), padded, expected, offsets)

    assert torch.equal(outs["padded"], outs["exact"])
    torch.testing.assert_close(outs["padded"].double(), expected, **TOLERANCES[torch.float16])
    assert torch.equal(outs["padded"][NUM_TOKENS:], base[NUM_TOKENS:])  # the padding rows are base


def test_tuning_configs_and_wider_tiles_match_reference() -> None:
    """Non-default knobs: 32-row tiles, a 32-wide K step split 4 ways, 32-wide expand tiles (several per
    slice, some past a slice's end), 2 warps."""
    generator = torch.Generator().manual_seed(15)
    token_slots = adapter_mix("skewed", NUM_TOKENS, seed=16)
    meta = sgmv_metadata(token_slots, SLOT_RANKS, tile_rows=32, extra_tiles=2)
    x = torch.randn(NUM_TOKENS, IN_FEATURES, generator=generator)
    lora_a = lora_a_slices(3, torch.float32, generator)
    lora_b = lora_b_slices(torch.float32, generator)
    offsets = [0, OUT_FEATURES[0], OUT_FEATURES[0] + OUT_FEATURES[1], sum(OUT_FEATURES)]
    shrunk = torch.zeros(3, NUM_TOKENS, MAX_RANK)
    expected_shrunk = shrunk.double()
    reference.sgmv_shrink(x.double(), fp64(lora_a), meta, expected_shrunk)
    sgmv.sgmv_shrink(x, lora_a, meta, shrunk, split_k=4,
                     config=sgmv.ShrinkConfig(block_k=32, num_warps=2, num_stages=2))
    torch.testing.assert_close(shrunk.double(), expected_shrunk, **TOLERANCES[torch.float32])

    base_out = torch.randn(NUM_TOKENS, sum(OUT_FEATURES), generator=generator)
    expected = base_out.double()
    reference.sgmv_expand(expected_shrunk, fp64(lora_b), meta, expected, offsets)
    sgmv.sgmv_expand(expected_shrunk.float(), lora_b, meta, base_out, offsets,
                     config=sgmv.ExpandConfig(block_n=32, num_warps=2))
    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])


def test_padding_tiles_alone_launch_programs_that_do_nothing() -> None:
    """A capacity with no real tile (a base-only replay of a graph captured with adapters)."""
    meta = sgmv_metadata([-1] * 6, SLOT_RANKS, extra_segments=2, extra_tiles=3)
    assert meta.num_segments == 0 and meta.tile_segments.tolist() == [-1, -1, -1]
    x = torch.randn(6, IN_FEATURES)
    out = torch.full((1, 6, MAX_RANK), 5.0)
    sgmv.sgmv_shrink(x, lora_a_slices(1, torch.float32, torch.Generator().manual_seed(0)), meta, out, split_k=2)
    assert torch.equal(out, torch.full((1, 6, MAX_RANK), 5.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mix", MIXES)
def test_expand_matches_reference(mix: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(5)
    token_slots = adapter_mix(mix, NUM_TOKENS, seed=6)
    meta = sgmv_metadata(token_slots, SLOT_RANKS)
    y = torch.randn(3, NUM_TOKENS, MAX_RANK, generator=generator)  # [slices, T, R]
    for row, slot in enumerate(token_slots):
        y[:, row, SLOT_RANKS[slot] if slot >= 0 else 0:] = float("nan")  # shrink leaves these unwritten
    y = y.to(dtype)
    lora_b = lora_b_slices(dtype, generator)
    offsets = [0, OUT_FEATURES[0], OUT_FEATURES[0] + OUT_FEATURES[1], sum(OUT_FEATURES)]
    base_out = torch.randn(NUM_TOKENS, sum(OUT_FEATURES), generator=generator).to(dtype)  # [T, out]
    expected = base_out.double()
    reference.sgmv_expand(y.double(), fp64(lora_b), meta, expected, offsets)

    sgmv.sgmv_expand(y, lora_b, meta, base_out, offsets)

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[dtype])


def test_single_slice_shrink_then_expand_is_the_lora_delta() -> None:
    """One slice (o_proj-like) end to end against x @ A.T @ B.T per token, written from the definition."""
    generator = torch.Generator().manual_seed(7)
    token_slots = adapter_mix("zipf", NUM_TOKENS, seed=8)
    meta = sgmv_metadata(token_slots, SLOT_RANKS)
    x = torch.randn(NUM_TOKENS, IN_FEATURES, generator=generator)
    lora_a = lora_a_slices(1, torch.float32, generator)
    lora_b = [lora_b_slices(torch.float32, generator)[0]]
    base_out = torch.randn(NUM_TOKENS, OUT_FEATURES[0], generator=generator)
    expected = base_out.double().clone()
    for row, slot in enumerate(token_slots):
        if slot >= 0:
            rank = SLOT_RANKS[slot]
            a, b = lora_a[0][slot, :rank].double(), lora_b[0][slot, :, :rank].double()
            expected[row] += b @ (a @ x[row].double())

    shrunk = torch.zeros(1, NUM_TOKENS, MAX_RANK)
    sgmv.sgmv_shrink(x, lora_a, meta, shrunk)
    sgmv.sgmv_expand(shrunk, lora_b, meta, base_out, [0, OUT_FEATURES[0]])

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])


def test_rejects_weights_in_another_dtype() -> None:
    meta = sgmv_metadata([0] * 4, SLOT_RANKS)
    x = torch.randn(4, IN_FEATURES)
    lora_a = [torch.zeros(len(SLOT_RANKS), MAX_RANK, IN_FEATURES, dtype=torch.float16)]
    with pytest.raises(AssertionError, match="lora_a"):
        sgmv.sgmv_shrink(x, lora_a, meta, torch.zeros(1, 4, MAX_RANK))


ALL_RANKS = [1, 2, 3, 4, 5, 7, 8, 12, 16, 17, 24, 31, 32, 33, 48, 63, 64]  # every power of two and odd ones between


def test_every_rank_from_1_to_64_in_one_batch() -> None:
    """Shrink then expand over slots of ranks 1..64 at once (a 64-wide pool), against x @ A.T @ B.T.

    Each slot's weights are NaN past its own rank, so a kernel that reads the rank padding fails.
    """
    generator = torch.Generator().manual_seed(21)
    slots, max_rank = len(ALL_RANKS), 64
    token_slots = [slot for slot in range(slots) for _ in range(2)] + [-1, -1]  # two tokens per slot, two base
    order = torch.randperm(len(token_slots), generator=generator).tolist()
    token_slots = [token_slots[i] for i in order]
    num_tokens = len(token_slots)
    meta = sgmv_metadata(token_slots, ALL_RANKS)
    x = torch.randn(num_tokens, IN_FEATURES, generator=generator)
    lora_a = torch.randn(slots, max_rank, IN_FEATURES, generator=generator) / IN_FEATURES ** 0.5
    lora_b = torch.randn(slots, OUT_FEATURES[0], max_rank, generator=generator) / max_rank ** 0.5
    for slot, rank in enumerate(ALL_RANKS):
        lora_a[slot, rank:] = float("nan")
        lora_b[slot, :, rank:] = float("nan")
    base_out = torch.randn(num_tokens, OUT_FEATURES[0], generator=generator)
    expected = base_out.double().clone()
    for row, slot in enumerate(token_slots):
        if slot >= 0:
            rank = ALL_RANKS[slot]
            a, b = lora_a[slot, :rank].double(), lora_b[slot, :, :rank].double()
            expected[row] += b @ (a @ x[row].double())

    shrunk = torch.zeros(1, num_tokens, max_rank)
    sgmv.sgmv_shrink(x, [lora_a], meta, shrunk)
    sgmv.sgmv_expand(shrunk, [lora_b], meta, base_out, [0, OUT_FEATURES[0]])

    torch.testing.assert_close(base_out.double(), expected, **TOLERANCES[torch.float32])
