"""Triton rotary_write_kv_cache (interpreted on the CPU) against kernels/reference.py: bit-exact.

q, k and v are views into one fused qkv output, as in the model, so their token strides differ
from their shapes; the caches start full of random stale values; some tokens are padding.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.engine.model.layers import RotaryEmbedding
from loraloom.kernels import reference, rotary

BLOCK_SIZE = 16
NUM_BLOCKS = 6


def inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=generator).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, 5000, (tokens,), generator=generator)
    cos, sin = RotaryEmbedding(head_dim, 500000.0, None, "cpu")(positions, dtype)
    cache_shape = (NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, generator=generator).to(dtype) for _ in range(2))
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=generator)[:tokens]
    return (q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim),
            cos, sin, k_cache, v_cache, slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 16), (8, 2, 32), (6, 2, 48)],
                         ids=["group1", "group4", "head_dim48"])
def test_rotary_write_kv_cache_is_bit_exact(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    q, k, v, cos, sin, k_cache, v_cache, slots = inputs(7, heads, kv_heads, head_dim, dtype, seed=heads + head_dim)
    k_before = k.clone()
    expected_q, _, _, _, _, expected_k_cache, expected_v_cache, _ = [t.clone() for t in (q, k, v, cos, sin, k_cache,
                                                                                         v_cache, slots)]
    reference.rotary_write_kv_cache(expected_q, k, v, cos, sin, expected_k_cache, expected_v_cache, slots)

    rotary.rotary_write_kv_cache(q, k, v, cos, sin, k_cache, v_cache, slots)

    assert torch.equal(q, expected_q)
    assert torch.equal(k_cache, expected_k_cache) and torch.equal(v_cache, expected_v_cache)
    assert torch.equal(k, k_before)  # key is read, not rotated in place


def test_padding_tokens_write_nothing() -> None:
    q, k, v, cos, sin, k_cache, v_cache, slots = inputs(5, 4, 2, 16, torch.float32, seed=1)
    slots[[1, 3]] = -1
    expected_q = q.clone()
    expected_k_cache, expected_v_cache = k_cache.clone(), v_cache.clone()
    real = torch.tensor([0, 2, 4])
    reference.rotary_write_kv_cache(expected_q, k, v, cos, sin, k_cache.clone(), v_cache.clone(), slots.clamp(min=0))
    reference.write_kv_cache(reference.apply_rotary(k[real], cos[real, None], sin[real, None]), v[real],
                             expected_k_cache, expected_v_cache, slots[real])

    rotary.rotary_write_kv_cache(q, k, v, cos, sin, k_cache, v_cache, slots)

    assert torch.equal(q, expected_q)  # padding rows are still rotated: harmless, and branch-free
    assert torch.equal(k_cache, expected_k_cache) and torch.equal(v_cache, expected_v_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_cache_write_is_bit_exact(dtype: torch.dtype) -> None:
    """Rotated k quantized with k_scale, v with v_scale (small enough that some codes saturate), padding skipped."""
    q, k, v, cos, sin, _, _, slots = inputs(7, 8, 2, 32, dtype, seed=5)
    slots[2] = -1
    generator = torch.Generator().manual_seed(6)
    k_cache, v_cache = (torch.randn(NUM_BLOCKS, BLOCK_SIZE, 2, 32, generator=generator).to(torch.float8_e4m3fn)
                        for _ in range(2))
    k_scale, v_scale = torch.tensor([0.01]), torch.tensor([0.003])
    expected_q, expected_k_cache, expected_v_cache = q.clone(), k_cache.clone(), v_cache.clone()
    reference.rotary_write_kv_cache(expected_q, k, v, cos, sin, expected_k_cache, expected_v_cache, slots,
                                    k_scale, v_scale)

    rotary.rotary_write_kv_cache(q, k, v, cos, sin, k_cache, v_cache, slots, k_scale, v_scale)

    assert torch.equal(q, expected_q)
    assert torch.equal(k_cache.view(torch.uint8), expected_k_cache.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), expected_v_cache.view(torch.uint8))
    assert bool((v_cache.float().abs() == 448).any()), "the case should saturate some V codes"
