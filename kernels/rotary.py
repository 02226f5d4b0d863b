"""Rotary embedding fused with the KV cache write: one launch per layer instead of ~10.

In torch, rotating q and k is a split, a negation, a cat, two multiplies and an add per tensor,
then write_kv_cache: about ten launches per layer, 320 per decode step of Llama-3.1-8B. Here one
program per token rotates its q heads in place, rotates its k heads and writes them with its v
heads into the paged cache (kernels/paged_attention.py's layout). Padding tokens (slot -1) are
rotated but write nothing.

Numerics are those of kernels/reference.py's apply_rotary in the tensors' dtype: x * cos and
rotate_half(x) * sin are each rounded to the dtype before their sum is, as torch rounds each op.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraloom.kernels.cache_checks import check_cache, check_cache_write
from loraloom.kernels.fp8_quant import quantize_to_e4m3
from loraloom.kernels.kv_quant import check_kv_scales, is_fp8_cache
from loraloom.kernels.paged_decode import kernel_scales


@triton.jit
def _rotate(x1, x2, cos1, cos2, sin1, sin2, dtype: tl.constexpr):
    """(x1, x2) = the two halves of head_dim -> the halves of x * cos + rotate_half(x) * sin."""
    out1 = ((x1 * cos1).to(dtype).to(tl.float32) + (-x2 * sin1).to(dtype).to(tl.float32)).to(dtype)
    out2 = ((x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)).to(dtype)
    return out1, out2


@triton.jit
def _rotary_write_kv_cache_kernel(
    query_ptr,  # [T, H, D], rotated in place
    key_ptr, value_ptr,  # [T, KVH, D]
    cos_ptr, sin_ptr,  # [T, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, KVH, D]
    slot_mapping_ptr,  # [T] int64
    k_scale_ptr, v_scale_ptr,  # [1] fp32, read only when FP8_KV
    num_heads, kv_heads, half, block_size,
    stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    stride_cos_tok, stride_sin_tok,
    stride_c_block, stride_c_pos, stride_c_head,
    FP8_KV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KVH: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    dtype = query_ptr.dtype.element_ty
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos1 = tl.load(cos_ptr + token * stride_cos_tok + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + token * stride_cos_tok + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + token * stride_sin_tok + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + token * stride_sin_tok + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]

    offs_h = tl.arange(0, BLOCK_H)
    q_mask = (offs_h < num_heads)[:, None] & d_mask[None, :]
    q_first = query_ptr + token * stride_q_tok + offs_h[:, None] * stride_q_head + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF]
    q1 = tl.load(q_first, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_first + half, mask=q_mask, other=0.0).to(tl.float32)
    q1, q2 = _rotate(q1, q2, cos1, cos2, sin1, sin2, dtype)
    tl.store(q_first, q1, mask=q_mask)
    tl.store(q_first + half, q2, mask=q_mask)

    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:
        offs_kvh = tl.arange(0, BLOCK_KVH)
        kv_mask = (offs_kvh < kv_heads)[:, None] & d_mask[None, :]
        k_first = key_ptr + token * stride_k_tok + offs_kvh[:, None] * stride_k_head + offs_d[None, :]
        k1 = tl.load(k_first, mask=kv_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_first + half, mask=kv_mask, other=0.0).to(tl.float32)
        k1, k2 = _rotate(k1, k2, cos1, cos2, sin1, sin2, key_ptr.dtype.element_ty)
        dest = ((slot // block_size) * stride_c_block + (slot % block_size) * stride_c_pos
                + offs_kvh[:, None] * stride_c_head + offs_d[None, :])
        v_first = value_ptr + token * stride_v_tok + offs_kvh[:, None] * stride_v_head + offs_d[None, :]
        v1 = tl.load(v_first, mask=kv_mask)
        v2 = tl.load(v_first + half, mask=kv_mask)
        if FP8_KV:
            k_scale = tl.load(k_scale_ptr)
            v_scale = tl.load(v_scale_ptr)
            tl.store(k_cache_ptr + dest, quantize_to_e4m3(k1, k_scale), mask=kv_mask)
            tl.store(k_cache_ptr + dest + half, quantize_to_e4m3(k2, k_scale), mask=kv_mask)
            tl.store(v_cache_ptr + dest, quantize_to_e4m3(v1, v_scale), mask=kv_mask)
            tl.store(v_cache_ptr + dest + half, quantize_to_e4m3(v2, v_scale), mask=kv_mask)
        else:
            cache_dtype = k_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + dest, k1.to(cache_dtype), mask=kv_mask)
            tl.store(k_cache_ptr + dest + half, k2.to(cache_dtype), mask=kv_mask)
            tl.store(v_cache_ptr + dest, v1.to(cache_dtype), mask=kv_mask)
            tl.store(v_cache_ptr + dest + half, v2.to(cache_dtype), mask=kv_mask)


def rotary_write_kv_cache(
    query: torch.Tensor,  # [T, H, D], rotated in place
    key: torch.Tensor,  # [T, KVH, D], left as it is
    value: torch.Tensor,  # [T, KVH, D]
    cos: torch.Tensor,  # [T, D]
    sin: torch.Tensor,  # [T, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only
    v_scale: torch.Tensor | None = None,
) -> None:
    """query <- rotary(query); cache[slot_mapping[t]] <- (rotary(key[t]), value[t]) (FP8: / scale, e4m3)."""
    check_cache(k_cache, v_cache)
    check_kv_scales(k_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = query.shape
    kv_heads = key.shape[1]
    assert head_dim % 2 == 0, f"rotary needs an even head_dim; got {head_dim}"
    assert key.shape == value.shape == (num_tokens, kv_heads, head_dim), (
        f"key {tuple(key.shape)} and value {tuple(value.shape)} must be [T={num_tokens}, KVH, D={head_dim}]")
    assert query.dtype == key.dtype, f"query {query.dtype} and key {key.dtype} must share a dtype"
    assert cos.shape == sin.shape == (num_tokens, head_dim) and cos.dtype == sin.dtype == query.dtype, (
        f"cos/sin must be [T={num_tokens}, D={head_dim}] in {query.dtype}; got {tuple(cos.shape)} {cos.dtype}, "
        f"{tuple(sin.shape)} {sin.dtype}")
    for name, tensor in (("query", query), ("key", key), ("value", value), ("cos", cos), ("sin", sin)):
        assert tensor.stride(-1) == 1, f"{name} must have a contiguous last dimension"
    check_cache_write(k_cache, slot_mapping, num_tokens, kv_heads, head_dim)
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_write_kv_cache_kernel[(num_tokens,)](
        query, key, value, cos, sin, k_cache, v_cache, slot_mapping,
        *kernel_scales(k_cache, k_scale, v_scale),
        num_heads, kv_heads, half, k_cache.shape[1],
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        FP8_KV=is_fp8_cache(k_cache), BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KVH=triton.next_power_of_2(kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
    )
