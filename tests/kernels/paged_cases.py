"""Paged KV caches and attention metadata for the attention kernel tests.

Requests get scrambled physical blocks, lengths that are not multiples of the block size, and
mixes of decode (one new token), prefill (no context) and chunked prefill (context + several
new tokens) in one batch. Caches start full of random data, so a read of the wrong position
shows.
"""
from __future__ import annotations

import torch

from loraloom.kernels.dtypes import quantize_with_scale
from loraloom.kernels.metadata import AttentionMetadata

BLOCK_SIZE = 16
NUM_BLOCKS = 48
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}

# (context tokens already cached, new tokens this step) per request
DECODE_ONLY = [(36, 1), (0, 1), (15, 1), (70, 1)]
PREFILL_ONLY = [(0, 23), (0, 9)]
MIXED = [(40, 1), (0, 37), (21, 19), (16, 1), (5, 2), (63, 1), (30, 16)]
# A speculative decoding step: decodes beside requests verifying drafts (their last token + proposals).
VERIFY = [(40, 4), (17, 7), (63, 1), (8, 2), (31, 1), (2, 5)]


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


def decode_inputs(requests, heads: int, kv_heads: int, dtype: torch.dtype, seed: int, head_dim: int = 32):
    """(metadata, query, k_cache, v_cache) for `requests`, with the new tokens' K/V taken as already cached."""
    generator = torch.Generator().manual_seed(seed)
    meta = attention_metadata(requests, generator)
    query = torch.randn(meta.slot_mapping.numel(), heads, head_dim, generator=generator).to(dtype)
    k_cache, v_cache = random_caches(kv_heads, head_dim, dtype, generator)
    return meta, query, k_cache, v_cache


# ------------------------------------------------------------------ FP8 (e4m3) cache
K_SCALE, V_SCALE = 0.02, 0.005  # |K| up to ~4 / 0.02 = 200 fits; |V| / 0.005 reaches past 448 and saturates


def fp8_caches(kv_heads: int, head_dim: int, generator: torch.Generator):
    """FP8 caches full of random stale codes, and their [1] fp32 scales."""
    k_cache, v_cache = random_caches(kv_heads, head_dim, torch.float32, generator)
    k_scale, v_scale = torch.tensor([K_SCALE]), torch.tensor([V_SCALE])
    return (quantize_with_scale(k_cache * K_SCALE * 50, k_scale), quantize_with_scale(v_cache * V_SCALE * 50, v_scale),
            k_scale, v_scale)
