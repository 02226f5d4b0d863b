"""Triton write_kv_cache and paged_attention (interpreted on the CPU) against kernels/reference.py.

Requests get scrambled physical blocks, lengths that are not multiples of the block size, and
mixes of decode (one new token), prefill (no context) and chunked prefill (context + several
new tokens) in one batch.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import paged_attention, paged_decode, reference
from loraloom.kernels.fp8 import quantize_with_scale
from loraloom.kernels.metadata import AttentionMetadata

BLOCK_SIZE = 16
NUM_BLOCKS = 48
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}

# (context tokens already cached, new tokens this step) per request
DECODE_ONLY = [(36, 1), (0, 1), (15, 1), (70, 1)]
PREFILL_ONLY = [(0, 23), (0, 9)]
MIXED = [(40, 1), (0, 37), (21, 19), (16, 1), (5, 2), (63, 1), (30, 16)]


def attention_metadata(requests: list[tuple[int, int]], generator: torch.Generator) -> AttentionMetadata:
    """Block tables over a shuffled pool of physical blocks; slot_mapping for the new tokens."""
    seq_lens = [context + new for context, new in requests]
    blocks_needed = [-(-length // BLOCK_SIZE) for length in seq_lens]
    physical = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
    assert sum(blocks_needed) <= NUM_BLOCKS, "test case needs more blocks than NUM_BLOCKS"
    tables = torch.zeros(len(requests), max(blocks_needed), dtype=torch.int32)
    slots = []
    for b, ((context, new), count) in enumerate(zip(requests, blocks_needed)):
        own = [physical.pop() for _ in range(count)]
        tables[b, :count] = torch.tensor(own)
        slots += [own[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(context, context + new)]
    starts = [0]
    for _, new in requests:
        starts.append(starts[-1] + new)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
    )


def random_caches(kv_heads: int, head_dim: int, dtype: torch.dtype, generator: torch.Generator):
    """Caches already holding random context K/V (every block, so stale data is everywhere)."""
    shape = (NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim)
    return torch.randn(shape, generator=generator).to(dtype), torch.randn(shape, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv_cache_matches_reference(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    meta = attention_metadata(MIXED, generator)
    tokens = meta.slot_mapping.numel()
    key = torch.randn(tokens, 2, 48, generator=generator)  # [T, KVH, D], fp32 cast to the cache dtype
    value = torch.randn(tokens, 2, 48, generator=generator)
    k_cache, v_cache = random_caches(2, 48, dtype, generator)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    reference.write_kv_cache(key, value, k_expected, v_expected, meta.slot_mapping)

    paged_attention.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)

    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_write_kv_cache_skips_padding_slots() -> None:
    generator = torch.Generator().manual_seed(1)
    key = torch.randn(4, 1, 16, generator=generator)
    value = torch.randn(4, 1, 16, generator=generator)
    k_cache, v_cache = random_caches(1, 16, torch.float32, generator)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([5, -1, 40, -1])

    paged_attention.write_kv_cache(key, value, k_cache, v_cache, slots)

    reference.write_kv_cache(key[[0, 2]], value[[0, 2]], before_k, before_v, slots[[0, 2]])
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (6, 2), (8, 2)], ids=["group1", "group3", "group4"])
@pytest.mark.parametrize("requests", [DECODE_ONLY, PREFILL_ONLY, MIXED], ids=["decode", "prefill", "mixed"])
def test_paged_attention_matches_reference(
    requests: list[tuple[int, int]], heads: int, kv_heads: int, dtype: torch.dtype,
) -> None:
    head_dim = 64
    generator = torch.Generator().manual_seed(heads * 10 + len(requests))
    meta = attention_metadata(requests, generator)
    tokens = meta.slot_mapping.numel()
    query = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)  # [T, H, D]
    key = torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype)  # [T, KVH, D]
    value = torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype)
    k_cache, v_cache = random_caches(kv_heads, head_dim, dtype, generator)
    paged_attention.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    scale = head_dim ** -0.5

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, scale)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, scale)

    assert out.dtype == dtype and out.shape == query.shape
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


def test_paged_attention_head_dim_not_a_power_of_two() -> None:
    generator = torch.Generator().manual_seed(2)
    meta = attention_metadata(MIXED[:4], generator)
    tokens = meta.slot_mapping.numel()
    query = torch.randn(tokens, 3, 48, generator=generator)
    k_cache, v_cache = random_caches(1, 48, torch.float32, generator)

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, 0.3)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.3)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float32])


def test_one_token_request_attends_only_its_own_sequence() -> None:
    """A single cached position: the output is exactly that position's value, whatever the query."""
    generator = torch.Generator().manual_seed(3)
    meta = attention_metadata([(0, 1), (0, 1)], generator)
    k_cache, v_cache = random_caches(2, 32, torch.float32, generator)
    query = torch.randn(2, 4, 32, generator=generator) * 10

    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 1.0)

    for b, slot in enumerate(meta.slot_mapping.tolist()):
        own_value = v_cache[slot // BLOCK_SIZE, slot % BLOCK_SIZE]  # [KVH, D]
        torch.testing.assert_close(out[b], own_value.repeat_interleave(2, dim=0))


# ------------------------------------------------------------------ split-KV decode
# Lengths around the split alignment (DECODE_BLOCK_N = 64): short, exact multiples, one past.
SPLIT_DECODES = [(0, 1), (63, 1), (127, 1), (128, 1), (200, 1), (40, 1)]


def with_padding_rows(meta: AttentionMetadata, rows: int) -> AttentionMetadata:
    """Append requests with no new token, as a CUDA-graph batch padded to its captured size does.

    Their seq_lens and block tables are garbage far out of range: any read through them would
    fault (or, compiled, read another request's blocks), so the test proves they are skipped.
    """
    starts = meta.query_start_loc_host + [meta.query_start_loc_host[-1]] * rows
    seq_lens = meta.seq_lens_host + [10 ** 6] * rows
    garbage = torch.full((rows, meta.block_tables.shape[1]), 10 ** 8, dtype=torch.int32)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.cat([meta.block_tables, garbage]),
        slot_mapping=meta.slot_mapping,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
    )


def decode_inputs(requests, heads: int, kv_heads: int, dtype: torch.dtype, seed: int, head_dim: int = 32):
    generator = torch.Generator().manual_seed(seed)
    meta = attention_metadata(requests, generator)
    query = torch.randn(meta.slot_mapping.numel(), heads, head_dim, generator=generator).to(dtype)
    k_cache, v_cache = random_caches(kv_heads, head_dim, dtype, generator)
    return meta, query, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (8, 2), (8, 1)], ids=["group1", "group4", "group8"])
def test_split_kv_decode_matches_reference(heads: int, kv_heads: int, num_splits: int, dtype: torch.dtype) -> None:
    meta, query, k_cache, v_cache = decode_inputs(SPLIT_DECODES, heads, kv_heads, dtype, seed=num_splits + heads)
    scale = 32 ** -0.5

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, scale)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, scale, num_splits=num_splits)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


def test_more_splits_than_blocks_leaves_empty_splits_neutral() -> None:
    """32 splits over sequences of 1..3 KV tiles: most splits have no work at all."""
    meta, query, k_cache, v_cache = decode_inputs([(0, 1), (70, 1), (150, 1)], 4, 2, torch.float32, seed=7)

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, 0.2)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.2, num_splits=32)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_skips_padding_requests(num_splits: int) -> None:
    meta, query, k_cache, v_cache = decode_inputs(SPLIT_DECODES[:3], 8, 2, torch.float32, seed=8)
    padded = with_padding_rows(meta, 3)

    out = paged_attention.paged_attention(query, k_cache, v_cache, padded, 0.2, num_splits=num_splits)

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, 0.2)
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float32])


def test_split_decode_next_to_prefill() -> None:
    """A mixed step: split decode rows and the prefill launch write disjoint rows of one output."""
    meta, query, k_cache, v_cache = decode_inputs(MIXED, 8, 2, torch.float16, seed=9)

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, 0.2)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.2, num_splits=3)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float16])


def test_num_splits_fills_the_gpu_from_shapes_only() -> None:
    cpu = torch.device("cpu")
    one_request = paged_decode.choose_num_splits(1, 8, 8192, cpu)
    assert one_request > 1 and 8 * one_request >= paged_decode.CPU_SM_COUNT
    assert one_request <= paged_decode.MAX_SPLITS
    assert paged_decode.choose_num_splits(64, 8, 1024, cpu) == 1  # 512 programs already fill 132 SMs
    # Never more splits than the block table has KV tiles room for.
    assert paged_decode.choose_num_splits(1, 8, 2 * paged_decode.DECODE_BLOCK_N, cpu) == 2
    assert paged_decode.choose_num_splits(0, 8, 1024, cpu) == 1


# ------------------------------------------------------------------ FP8 (e4m3) cache
FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.02, 0.005  # |K| up to ~4 / 0.02 = 200 fits; |V| / 0.005 reaches past 448 and saturates


def fp8_caches(kv_heads: int, head_dim: int, generator: torch.Generator):
    """FP8 caches full of random stale codes, and their [1] fp32 scales."""
    k_cache, v_cache = random_caches(kv_heads, head_dim, torch.float32, generator)
    k_scale, v_scale = torch.tensor([K_SCALE]), torch.tensor([V_SCALE])
    return (quantize_with_scale(k_cache * K_SCALE * 50, k_scale), quantize_with_scale(v_cache * V_SCALE * 50, v_scale),
            k_scale, v_scale)


def test_fp8_reference_write_rounds_to_nearest_e4m3_and_saturates() -> None:
    """The reference against the definition: stored * scale is x to 3 mantissa bits, or +-448 * scale."""
    generator = torch.Generator().manual_seed(11)
    meta = attention_metadata(MIXED, generator)
    tokens = meta.slot_mapping.numel()
    key = torch.randn(tokens, 2, 32, generator=generator, dtype=torch.float64) * 4
    value = torch.randn(tokens, 2, 32, generator=generator, dtype=torch.float64) * 4
    k_cache, v_cache, k_scale, v_scale = fp8_caches(2, 32, generator)

    reference.write_kv_cache(key.float(), value.float(), k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)

    slots = meta.slot_mapping
    for cache, source, scale in ((k_cache, key, K_SCALE), (v_cache, value, V_SCALE)):
        stored = cache.view(-1, 2, 32)[slots].double() * scale
        expected = source.clamp(-448 * scale, 448 * scale)
        # Nearest e4m3 value: within half a step, 2^-4 of the value (normals) or 2^-10 * scale (subnormals).
        bound = torch.maximum(expected.abs() * 2.0 ** -4, torch.full_like(expected, 2.0 ** -10 * scale))
        assert bool(((stored - expected).abs() <= bound).all())
    assert bool((v_cache.view(-1, 2, 32)[slots].float().abs() == 448).any()), "the case should saturate some V"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_write_kv_cache_is_bit_exact(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(12)
    meta = attention_metadata(MIXED, generator)
    tokens = meta.slot_mapping.numel()
    key = (torch.randn(tokens, 2, 48, generator=generator) * 4).to(dtype)  # [T, KVH, D]
    value = (torch.randn(tokens, 2, 48, generator=generator) * 4).to(dtype)
    key[0, 0, :4] = torch.tensor([1e-5, -1e-6, 0.0, -0.0])  # subnormal codes and signed zeros
    k_cache, v_cache, k_scale, v_scale = fp8_caches(2, 48, generator)
    slots = meta.slot_mapping.clone()
    slots[3] = -1  # a padding token
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    reference.write_kv_cache(key, value, k_expected, v_expected, slots, k_scale, v_scale)

    paged_attention.write_kv_cache(key, value, k_cache, v_cache, slots, k_scale, v_scale)

    assert torch.equal(k_cache.view(torch.uint8), k_expected.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_expected.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("requests", [DECODE_ONLY, PREFILL_ONLY, MIXED], ids=["decode", "prefill", "mixed"])
def test_fp8_cache_attention_matches_reference(requests: list[tuple[int, int]], dtype: torch.dtype) -> None:
    """Prefill and decode over an FP8 cache against the reference dequantizing the same codes in fp64."""
    heads, kv_heads, head_dim = 8, 2, 32
    generator = torch.Generator().manual_seed(13 + len(requests))
    meta = attention_metadata(requests, generator)
    tokens = meta.slot_mapping.numel()
    query = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
    key = (torch.randn(tokens, kv_heads, head_dim, generator=generator) * 4).to(dtype)
    value = torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype)
    k_cache, v_cache, k_scale, v_scale = fp8_caches(kv_heads, head_dim, generator)
    paged_attention.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
    scale = head_dim ** -0.5

    expected = reference.paged_attention(query.double(), k_cache, v_cache, meta, scale, k_scale, v_scale)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, scale, k_scale, v_scale)

    assert expected.dtype == torch.float64 and out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_cache_split_decode_matches_reference(num_splits: int) -> None:
    generator = torch.Generator().manual_seed(14)
    meta = attention_metadata(SPLIT_DECODES, generator)
    query = torch.randn(len(SPLIT_DECODES), 8, 32, generator=generator, dtype=torch.float16)
    k_cache, v_cache, k_scale, v_scale = fp8_caches(2, 32, generator)

    expected = reference.paged_attention(query.double(), k_cache, v_cache, meta, 0.2, k_scale, v_scale)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.2, k_scale, v_scale, num_splits=num_splits)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float16])


def test_scales_must_match_the_cache_dtype() -> None:
    generator = torch.Generator().manual_seed(15)
    meta, query, k_cache, v_cache = decode_inputs(DECODE_ONLY, 4, 2, torch.float32, seed=15)
    fp8_k, fp8_v, k_scale, v_scale = fp8_caches(2, 32, generator)
    with pytest.raises(AssertionError, match="needs k_scale"):
        paged_attention.paged_attention(query, fp8_k, fp8_v, meta, 0.2)
    with pytest.raises(AssertionError, match="for an FP8 KV cache"):
        paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.2, k_scale, v_scale)
    with pytest.raises(AssertionError, match=r"\[1\] fp32"):
        reference.write_kv_cache(query[:, :2], query[:, :2], fp8_k, fp8_v, meta.slot_mapping, k_scale.double(), v_scale)
