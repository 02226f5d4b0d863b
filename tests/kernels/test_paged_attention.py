"""Triton write_kv_cache and paged_attention (interpreted on the CPU) against kernels/reference.py.

The cases (tests/kernels/paged_cases.py) mix decode, prefill and chunked prefill in one batch;
the split-KV decode launch has its own file, test_paged_decode.py.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import paged_attention, reference
from paged_cases import (
    BLOCK_SIZE, DECODE_ONLY, K_SCALE, MIXED, PREFILL_ONLY, TOLERANCES, V_SCALE, VERIFY, attention_metadata,
    decode_inputs, fp8_caches, random_caches,
)


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
@pytest.mark.parametrize("requests", [DECODE_ONLY, PREFILL_ONLY, MIXED, VERIFY],
                         ids=["decode", "prefill", "mixed", "verify"])
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


# ------------------------------------------------------------------ FP8 (e4m3) cache

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
