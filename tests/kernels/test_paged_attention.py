"""Triton write_kv_cache and paged_attention (interpreted on the CPU) against kernels/reference.py.

Requests get scrambled physical blocks, lengths that are not multiples of the block size, and
mixes of decode (one new token), prefill (no context) and chunked prefill (context + several
new tokens) in one batch.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import paged_attention, reference
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
