"""Split-KV decode (kernels/paged_decode.py, interpreted on the CPU) against kernels/reference.py.

Decode rows reach it through paged_attention, which launches it for every request with one new
token; num_splits is forced here to cover the split and combine passes.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import paged_attention, paged_decode, reference
from loraloom.kernels.metadata import AttentionMetadata
from paged_cases import MIXED, TOLERANCES, attention_metadata, decode_inputs, fp8_caches


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


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_cache_split_decode_matches_reference(num_splits: int) -> None:
    generator = torch.Generator().manual_seed(14)
    meta = attention_metadata(SPLIT_DECODES, generator)
    query = torch.randn(len(SPLIT_DECODES), 8, 32, generator=generator, dtype=torch.float16)
    k_cache, v_cache, k_scale, v_scale = fp8_caches(2, 32, generator)

    expected = reference.paged_attention(query.double(), k_cache, v_cache, meta, 0.2, k_scale, v_scale)
    out = paged_attention.paged_attention(query, k_cache, v_cache, meta, 0.2, k_scale, v_scale, num_splits=num_splits)

    torch.testing.assert_close(out.double(), expected, **TOLERANCES[torch.float16])
