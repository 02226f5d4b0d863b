"""Triton paged attention over a block-table KV cache, and the cache write that feeds it.

Cache layout: [num_blocks, block_size, KVH, D]; token position p of request b lives in block
block_tables[b, p // block_size] at offset p % block_size.

Two launches per call:
- decode (requests with one new token): kernels/paged_decode.py, split-KV so that even one
  request fills the GPU, and shaped only by tensor shapes so that a CUDA graph can replay it;
- prefill and chunked prefill (requests with more): the kernel below. A program owns one
  request, one KV head and a tile of BLOCK_M = 64 rows; row m is query token m // GROUP of the
  tile under query head kv_head * GROUP + m % GROUP, so the GROUP query heads that share a KV
  head share every K/V load and form the M dimension of tl.dot. Causal masking at positions
  seq_len - n + i, online softmax. Each K/V tile of BLOCK_N positions is gathered through the
  block table, so any block_size works and a tile may span blocks.
Each launch's programs exit at once for the other kind of request.

An FP8 (e4m3) cache (kernels/kv_quant.py) is written as e4m3(x / scale) and read by converting
the e4m3 values to the query's dtype (exact) for the products, with K's scale folded into the
softmax scale and V's into the output: one multiply per tile row instead of one per element.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraloom.kernels.cache_checks import check_cache, check_cache_write
from loraloom.kernels.fp8_quant import quantize_to_e4m3
from loraloom.kernels.kv_quant import check_kv_scales, is_fp8_cache
from loraloom.kernels.metadata import AttentionMetadata
from loraloom.kernels.paged_decode import LOG2_E, MIN_DOT_M, kernel_scales, paged_decode_attention

PREFILL_BLOCK_M = 64  # query rows (tokens x heads of a group) per prefill tile
BLOCK_N = 32  # cached positions per step of the K/V loop


@triton.jit
def _write_kv_cache_kernel(
    key_ptr, value_ptr,  # [T, KVH, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, KVH, D]
    slot_mapping_ptr,  # [T] int64
    k_scale_ptr, v_scale_ptr,  # [1] fp32, read only when FP8_KV
    block_size, kv_heads, head_dim,
    stride_k_tok, stride_k_head,
    stride_v_tok, stride_v_head,
    stride_c_block, stride_c_pos, stride_c_head,
    FP8_KV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return  # padding token (a CUDA-graph batch padded to its captured size)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < kv_heads)[:, None] & (offs_d < head_dim)[None, :]
    key_source = token * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]  # [BLOCK_H, BLOCK_D]
    value_source = token * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    dest = ((slot // block_size) * stride_c_block + (slot % block_size) * stride_c_pos
            + offs_h[:, None] * stride_c_head + offs_d[None, :])
    key = tl.load(key_ptr + key_source, mask=mask)
    value = tl.load(value_ptr + value_source, mask=mask)
    if FP8_KV:
        tl.store(k_cache_ptr + dest, quantize_to_e4m3(key, tl.load(k_scale_ptr)), mask=mask)
        tl.store(v_cache_ptr + dest, quantize_to_e4m3(value, tl.load(v_scale_ptr)), mask=mask)
    else:
        tl.store(k_cache_ptr + dest, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dest, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _paged_attention_kernel(
    query_ptr,  # [T, H, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, KVH, D]
    out_ptr,  # [T, H, D]
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    block_tables_ptr,  # [B, max_blocks_per_seq] int32
    k_scale_ptr, v_scale_ptr,  # [1] fp32, read only when FP8_KV
    scale_log2,  # softmax scale times log2(e)
    block_size, head_dim,
    stride_q_tok, stride_q_head,
    stride_o_tok, stride_o_head,
    stride_c_block, stride_c_pos, stride_c_head,
    stride_bt_seq,
    GROUP: tl.constexpr, FP8_KV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + seq)
    num_new = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    if num_new <= 1:
        return  # padding (0 new tokens) or a decode row (the decode launch owns it)
    TOKENS_PER_TILE: tl.constexpr = BLOCK_M // GROUP
    tile_first = q_tile * TOKENS_PER_TILE
    if tile_first >= num_new:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - num_new  # cached tokens before this step's new ones

    offs_m = tl.arange(0, BLOCK_M)
    q_index = tile_first + offs_m // GROUP  # [BLOCK_M] new-token index in the request
    head = kv_head * GROUP + offs_m % GROUP
    row_mask = (offs_m < TOKENS_PER_TILE * GROUP) & (q_index < num_new)
    q_pos = context + q_index  # absolute position: attends cache positions 0 .. q_pos
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim

    q_rows = (q_begin + q_index).to(tl.int64)
    query = tl.load(query_ptr + q_rows[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
                    mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if FP8_KV:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)  # q . (k_q * s) = (q . k_q) * s; k_q goes to q's dtype
    else:
        query = query.to(k_cache_ptr.dtype.element_ty)

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    # The tile's last query token sees positions up to context + tile_first + TOKENS_PER_TILE - 1.
    kv_end = tl.minimum(seq_len, context + tile_first + TOKENS_PER_TILE)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for kv_start in range(0, kv_end, BLOCK_N):
        offs_n = kv_start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        block_ids = tl.load(block_table + offs_n // block_size, mask=n_mask, other=0).to(tl.int64)
        cache_offsets = (block_ids * stride_c_block + (offs_n % block_size) * stride_c_pos
                         + kv_head * stride_c_head)  # [BLOCK_N]
        kv_mask = n_mask[None, :] & d_mask[:, None]
        keys = tl.load(k_cache_ptr + cache_offsets[None, :] + offs_d[:, None],
                       mask=kv_mask, other=0.0).to(query.dtype)  # [BLOCK_D, BLOCK_N]
        # "ieee" keeps fp32 inputs exact (no TF32); fp16/bf16 inputs ignore it.
        scores = tl.dot(query, keys, input_precision="ieee") * scale_log2  # [BLOCK_M, BLOCK_N]
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        # Position 0 is visible to every row and sits in the first tile, so row_max is finite
        # from the first step on and no exp2(-inf - -inf) NaN can appear.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        values = tl.load(v_cache_ptr + cache_offsets[:, None] + offs_d[None, :],
                         mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(query.dtype)  # [BLOCK_N, BLOCK_D]
        acc = acc * rescale[:, None] + tl.dot(probs.to(values.dtype), values, input_precision="ieee")
        row_max = new_max

    result = acc / row_sum[:, None]
    if FP8_KV:
        result = result * tl.load(v_scale_ptr)  # sum_n p_n (v_q,n * s) = s * sum_n p_n v_q,n
    tl.store(out_ptr + q_rows[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
             result.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def write_kv_cache(
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,  # [T, KVH, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    slot_mapping: torch.Tensor,  # [T] int64
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only (kernels/kv_quant.py)
    v_scale: torch.Tensor | None = None,
) -> None:
    """for t: cache[slot_mapping[t] // block_size, slot_mapping[t] % block_size] = kv[t]

    An FP8 cache stores e4m3(kv[t] / scale) instead. Tokens whose slot is negative are skipped
    (padding rows of a CUDA-graph batch).
    """
    check_cache(k_cache, v_cache)
    check_kv_scales(k_cache, k_scale, v_scale)
    num_tokens, kv_heads, head_dim = key.shape
    # value is usually a view into the fused qkv output while key is rotary's fresh tensor,
    # so the two may have different token/head strides; only head_dim must be contiguous.
    assert value.shape == key.shape, f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape"
    assert key.stride(2) == 1 and value.stride(2) == 1, "key/value must have contiguous head_dim"
    check_cache_write(k_cache, slot_mapping, num_tokens, kv_heads, head_dim)
    if num_tokens == 0:
        return
    fp8_kv = is_fp8_cache(k_cache)
    _write_kv_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *kernel_scales(k_cache, k_scale, v_scale),
        k_cache.shape[1], kv_heads, head_dim,
        key.stride(0), key.stride(1),
        value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        FP8_KV=fp8_kv, BLOCK_H=triton.next_power_of_2(kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


def paged_attention(
    query: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only: K = stored * k_scale
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,  # decode split-KV factor; None chooses it from the shapes
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of each request's new tokens over its whole cached sequence.

    for each request b with n new tokens and L = seq_lens[b] cached tokens:
        new token i sits at position L - n + i and attends cache positions 0 .. L - n + i,
        read through block_tables[b]; query head h uses KV head h // (H // KVH).
    The new tokens' K/V must already be in the cache (write_kv_cache first).
    Rows of requests with no new tokens are not written.
    """
    check_cache(k_cache, v_cache)
    check_kv_scales(k_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = query.shape
    kv_heads = k_cache.shape[2]
    assert query.stride(2) == 1, "query must have contiguous head_dim"
    assert k_cache.shape[3] == head_dim, f"KV cache head_dim {k_cache.shape[3]} != query head_dim {head_dim}"
    assert head_dim >= 16, f"head_dim {head_dim} is below tl.dot's minimum of 16"
    assert num_heads % kv_heads == 0, f"query heads {num_heads} must be a multiple of KV heads {kv_heads}"
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        tensor = getattr(meta, name)
        assert tensor.dtype == torch.int32 and tensor.device == query.device, (
            f"AttentionMetadata.{name} must be int32 on {query.device}; got {tensor.dtype} on {tensor.device}")
    assert meta.block_tables.stride(1) == 1, "AttentionMetadata.block_tables must have contiguous rows"

    out = torch.empty_like(query)
    # The host lists only size the prefill grid and skip a launch with nothing to do. A
    # decode-only step (every request 0 or 1 new tokens: what CUDA graphs capture, padding rows
    # included) always launches the decode kernel alone, whatever its rows hold at capture.
    qsl = meta.query_start_loc_host
    new_tokens = [end - start for start, end in zip(qsl, qsl[1:])]
    longest = max(new_tokens, default=0)
    if longest <= 1 or 1 in new_tokens:
        paged_decode_attention(query, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                               scale, out, k_scale, v_scale, num_splits=num_splits)
    if longest > 1:
        group = num_heads // kv_heads
        block_m = max(PREFILL_BLOCK_M, MIN_DOT_M, triton.next_power_of_2(group))
        _paged_attention_kernel[(meta.num_seqs, kv_heads, triton.cdiv(longest, block_m // group))](
            query, k_cache, v_cache, out,
            meta.query_start_loc, meta.seq_lens, meta.block_tables,
            *kernel_scales(k_cache, k_scale, v_scale),
            scale * LOG2_E,
            k_cache.shape[1], head_dim,
            query.stride(0), query.stride(1),
            out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            meta.block_tables.stride(0),
            GROUP=group, FP8_KV=is_fp8_cache(k_cache),
            BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=triton.next_power_of_2(head_dim),
        )
    return out
