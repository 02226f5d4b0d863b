"""The CPU backend's paged_attention (kernels/cpu_attention.py): decodes through the compiled op,
which reads K/V blocks in place, checked against the reference in fp64 on shuffled block tables
over caches full of stale values; prefills and non-float32 caches go to the reference itself."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import cpu_attention, cpu_extension, reference
from paged_cases import BLOCK_SIZE, DECODE_ONLY, MIXED, VERIFY, attention_metadata, random_caches

# Decodes deeper than one block and across block edges, next to a first token.
DEEP_DECODES = [(0, 1), (BLOCK_SIZE - 1, 1), (BLOCK_SIZE, 1), (5 * BLOCK_SIZE + 3, 1), (97, 1)]


@pytest.fixture(autouse=True)
def compiled_op_built() -> None:
    assert cpu_extension.load() is not None, "the CPU extension did not build (see kernels/cpu_extension.py)"


def attention_inputs(requests, heads: int, kv_heads: int, head_dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    meta = attention_metadata(requests, generator)
    tokens = meta.slot_mapping.numel()
    query = torch.randn(tokens, heads, head_dim, generator=generator)
    k_cache, v_cache = random_caches(kv_heads, head_dim, torch.float32, generator)
    return query, k_cache, v_cache, meta


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (9, 3), (8, 1)], ids=["group1", "group3", "group8"])
@pytest.mark.parametrize("requests", [DECODE_ONLY, DEEP_DECODES, MIXED, VERIFY], ids=["decode", "deep", "mixed", "verify"])
def test_matches_reference(requests, heads: int, kv_heads: int) -> None:
    query, k_cache, v_cache, meta = attention_inputs(requests, heads, kv_heads, head_dim=64, seed=heads + len(requests))
    scale = 64 ** -0.5

    expected = reference.paged_attention(query.double(), k_cache.double(), v_cache.double(), meta, scale)
    out = cpu_attention.paged_attention(query, k_cache, v_cache, meta, scale)

    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_large_scores_stay_finite() -> None:
    """Scores in the hundreds: the softmax must subtract the row's maximum before exponentiating."""
    query, k_cache, v_cache, meta = attention_inputs(DEEP_DECODES, 4, 2, head_dim=32, seed=5)
    out = cpu_attention.paged_attention(query * 40, k_cache * 40, v_cache, meta, 1.0)
    expected = reference.paged_attention((query * 40).double(), (k_cache * 40).double(), v_cache.double(), meta, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_query_that_is_a_strided_view() -> None:
    """The model passes q as a slice of the fused qkv output: not contiguous."""
    query, k_cache, v_cache, meta = attention_inputs(DECODE_ONLY, 4, 2, head_dim=32, seed=6)
    wide = torch.cat([query, torch.randn_like(query)], dim=2)  # [T, H, 2D]
    view = wide[:, :, :32]
    out = cpu_attention.paged_attention(view, k_cache, v_cache, meta, 0.2)
    torch.testing.assert_close(out, reference.paged_attention(query, k_cache, v_cache, meta, 0.2),
                               atol=2e-5, rtol=2e-5)


def test_other_dtypes_take_the_reference_path() -> None:
    query, k_cache, v_cache, meta = attention_inputs(MIXED, 4, 2, head_dim=32, seed=7)
    args = (query.double(), k_cache.double(), v_cache.double(), meta, 0.2)
    assert torch.equal(cpu_attention.paged_attention(*args), reference.paged_attention(*args))


@pytest.mark.parametrize("bad", ["empty_sequence", "past_the_table", "block_id"])
def test_compiled_op_refuses_indices_it_would_read_past(bad: str) -> None:
    """A wrong length or block id is an error, never a read outside the caches (a crash of the server)."""
    query, k_cache, v_cache, meta = attention_inputs(DECODE_ONLY, 4, 2, head_dim=32, seed=8)
    tables = meta.block_tables.clone()
    lens = list(meta.seq_lens_host)
    if bad == "empty_sequence":
        lens[0] = 0
    elif bad == "past_the_table":
        lens[0] = tables.shape[1] * BLOCK_SIZE + 1
    else:
        tables[0, 0] = k_cache.shape[0]
    rows = list(range(len(lens)))
    with pytest.raises(RuntimeError, match="paged_decode_attention"):
        cpu_extension.load().paged_decode_attention(query, k_cache, v_cache, tables, rows, rows, lens, 0.2,
                                                    torch.empty_like(query))
