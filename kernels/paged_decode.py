"""Split-KV ("flash-decoding") attention for requests with one new token, over the paged cache.

One program per (request, KV head) reads that head's whole sequence; at batch 1 that is 8
programs on 132 SMs for Llama-3.1-8B, so most of the GPU sits idle. Here each sequence is also
cut into `num_splits` contiguous, BLOCK_N-aligned ranges, one program per range:

    pass 1 (grid requests x KV heads x splits): softmax over its own range -> a normalized
        partial output and its log-sum-exp (base 2) per query head, in an fp32 workspace;
    pass 2 (grid requests x query heads): out = sum_s 2^(lse_s - lse) * partial_s with
        lse = log2(sum_s 2^lse_s), the exact softmax over the union of the ranges.

With num_splits == 1 pass 1 writes the output directly and pass 2 is not launched.

CUDA graphs replay a launch with new seq_lens but the captured grid, so num_splits depends on
shapes only (requests, KV heads, the block table's width, the SM count), never on the lengths;
each program finds its range on the device from seq_len, and a range past the end of a short
sequence writes a neutral partial (lse -inf, output 0) that pass 2 weighs by 2^-inf = 0.
Rows with no new token (padding of a graph batch: query_start_loc repeats) are skipped
before anything else is read.

FP8 cache (kernels/kv_quant.py): e4m3 K/V are converted to the query's dtype for the products;
K's scale is folded into the softmax scale and V's into the partial output (pass 2 is linear in
the partials, so scaling them before the combine is the same as after).

GQA: the GROUP query heads that share a KV head form the M rows of one tl.dot, so each K/V
tile is read once per KV head, not once per query head.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from loraloom.kernels.kv_quant import is_fp8_cache

DECODE_BLOCK_N = 64  # cached positions per step of a program's K/V loop (also the split alignment)
MIN_DOT_M = 16  # one m16n8k16 MMA; Triton would pad fewer rows to it anyway
LOG2_E = 1.4426950408889634  # softmax runs in base 2: exp(x) = exp2(x * log2(e))
MAX_SPLITS = 32  # beyond this pass 2 and the workspace grow for little extra parallelism
PROGRAMS_PER_SM = 2  # aim for this many pass-1 programs per SM so every SM has work
CPU_SM_COUNT = 132  # an H100's, used where there is no GPU to ask (the interpreter)


@triton.jit
def _paged_decode_kernel(
    query_ptr,  # [T, H, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, KVH, D]
    out_ptr,  # [T, H, D]; written only when NUM_SPLITS == 1
    partial_ptr,  # [B, H, NUM_SPLITS, BLOCK_D] fp32; written only when NUM_SPLITS > 1
    lse_ptr,  # [B, H, NUM_SPLITS] fp32 (base 2); written only when NUM_SPLITS > 1
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
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, FP8_KV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) - q_row != 1:
        return  # padding (0 new tokens) or a prefill row (the prefill launch owns it)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Split s covers [s * span, (s + 1) * span) clipped to the sequence; span is a multiple of
    # BLOCK_N so that every K/V tile but the sequence's last is full.
    span = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_begin = split * span
    kv_end = tl.minimum(seq_len, kv_begin + span)

    offs_m = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + offs_m
    row_mask = offs_m < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    q_row64 = q_row.to(tl.int64)
    query = tl.load(query_ptr + q_row64 * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
                    mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if FP8_KV:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)  # q . (k_q * s) = (q . k_q) * s; k_q goes to q's dtype
    else:
        query = query.to(k_cache_ptr.dtype.element_ty)

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    # An empty range (kv_begin >= kv_end) runs no iteration and leaves the neutral state.
    for kv_start in range(kv_begin, kv_end, BLOCK_N):
        offs_n = kv_start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        block_ids = tl.load(block_table + offs_n // block_size, mask=n_mask, other=0).to(tl.int64)
        cache_offsets = (block_ids * stride_c_block + (offs_n % block_size) * stride_c_pos
                         + kv_head * stride_c_head)  # [BLOCK_N]
        keys = tl.load(k_cache_ptr + cache_offsets[None, :] + offs_d[:, None],
                       mask=n_mask[None, :] & d_mask[:, None], other=0.0).to(query.dtype)  # [BLOCK_D, BLOCK_N]
        # "ieee" keeps fp32 inputs exact (no TF32); fp16/bf16 inputs ignore it.
        scores = tl.dot(query, keys, input_precision="ieee") * scale_log2  # [BLOCK_M, BLOCK_N]
        # The single new token sees the whole sequence: only the range's end masks. Position
        # kv_start is always inside the range, so new_max is finite and exp2 never sees -inf - -inf.
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        values = tl.load(v_cache_ptr + cache_offsets[:, None] + offs_d[None, :],
                         mask=n_mask[:, None] & d_mask[None, :], other=0.0).to(query.dtype)  # [BLOCK_N, BLOCK_D]
        acc = acc * rescale[:, None] + tl.dot(probs.to(values.dtype), values, input_precision="ieee")
        row_max = new_max
    if FP8_KV:
        acc = acc * tl.load(v_scale_ptr)  # sum_n p_n (v_q,n * s) = s * sum_n p_n v_q,n

    store_mask = row_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + q_row64 * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
                 (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        # A range with work has row_sum >= 1 (its maximum contributes 2^0), so the clamp changes
        # nothing there; an empty range gets partial 0 (not 0/0) and lse = -inf + log2(1) = -inf.
        row_sum = tl.maximum(row_sum, 1.0)
        partial = acc / row_sum[:, None]
        lse = row_max + tl.log2(row_sum)
        slot = (seq.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split  # [BLOCK_M]
        tl.store(partial_ptr + slot[:, None] * BLOCK_D + offs_d[None, :], partial, mask=store_mask)
        tl.store(lse_ptr + slot, lse, mask=row_mask)


@triton.jit
def _paged_decode_combine_kernel(
    partial_ptr,  # [B, H, NUM_SPLITS, BLOCK_D] fp32
    lse_ptr,  # [B, H, NUM_SPLITS] fp32
    out_ptr,  # [T, H, D]
    query_start_loc_ptr,  # [B + 1] int32
    head_dim, stride_o_tok, stride_o_head,
    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_row = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) - q_row != 1:
        return  # pass 1 wrote nothing for this row
    q_row64 = q_row.to(tl.int64)
    offs_s = tl.arange(0, SPLITS_P2)
    s_mask = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    first = (seq.to(tl.int64) * tl.num_programs(1) + head) * NUM_SPLITS  # this row's first split
    lse = tl.load(lse_ptr + first + offs_s, mask=s_mask, other=float("-inf"))  # [SPLITS_P2]
    # Split 0 starts at position 0 of a sequence of at least one token, so its lse is finite.
    lse_max = tl.max(lse, axis=0)
    weights = tl.exp2(lse - lse_max)  # 0 for empty splits
    partial = tl.load(partial_ptr + (first + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                      mask=s_mask[:, None], other=0.0)  # [SPLITS_P2, BLOCK_D]
    result = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + q_row64 * stride_o_tok + head * stride_o_head + offs_d, result.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_seqs: int, kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Splits per (request, KV head) so pass 1 fills the GPU, from shapes only (graph-safe).

    max_seq_len is the block table's capacity (width x block_size), a bound on every seq_len:
    more splits than BLOCK_N tiles in it would all be empty.
    """
    programs = num_seqs * kv_heads
    target = PROGRAMS_PER_SM * _sm_count(device)
    if programs == 0 or programs * 2 > target:
        return 1  # already at least one program per SM or so: splitting only adds pass 2
    return max(1, min(MAX_SPLITS, triton.cdiv(target, programs), triton.cdiv(max_seq_len, DECODE_BLOCK_N)))


def kernel_scales(k_cache: torch.Tensor, k_scale: torch.Tensor | None,
                  v_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale pointers a kernel takes: an FP8 cache's scales, else the cache itself (never read)."""
    if k_scale is None or v_scale is None:
        return k_cache, k_cache
    return k_scale, v_scale


def paged_decode_attention(
    query: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks_per_seq] int32
    scale: float,
    out: torch.Tensor,  # [T, H, D]: rows of one-token requests are written
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,  # None: choose_num_splits; tests force other values
) -> None:
    """Attention of every one-token request's query over its whole cached sequence.

    Validation of the shared inputs is the caller's (paged_attention.paged_attention).
    """
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if num_seqs == 0 or num_tokens == 0:
        return
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, kv_heads, block_tables.shape[1] * block_size, query.device)
    assert num_splits >= 1, f"num_splits must be at least 1; got {num_splits}"
    group = num_heads // kv_heads
    block_d = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        # Indexed by request, not token: a mixed step's prefill tokens need no room here.
        partial = torch.empty(num_seqs, num_heads, num_splits, block_d, dtype=torch.float32, device=query.device)
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        partial = lse = out  # not read: the NUM_SPLITS == 1 branch stores to out only
    _paged_decode_kernel[(num_seqs, kv_heads, num_splits)](
        query, k_cache, v_cache, out, partial, lse,
        query_start_loc, seq_lens, block_tables,
        *kernel_scales(k_cache, k_scale, v_scale),
        scale * LOG2_E,
        block_size, head_dim,
        query.stride(0), query.stride(1),
        out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, NUM_SPLITS=num_splits, FP8_KV=is_fp8_cache(k_cache),
        BLOCK_M=max(MIN_DOT_M, triton.next_power_of_2(group)), BLOCK_N=DECODE_BLOCK_N, BLOCK_D=block_d,
    )
    if num_splits > 1:
        _paged_decode_combine_kernel[(num_seqs, num_heads)](
            partial, lse, out, query_start_loc,
            head_dim, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, SPLITS_P2=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
