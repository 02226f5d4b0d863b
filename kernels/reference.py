"""Plain-torch reference implementations: the CPU path and the test oracle.

Each function keeps the signature of its Triton counterpart in kernels/, so the
engine switches implementations without touching call sites.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from loraloom.kernels.kv_quant import check_kv_scales, dequantize_kv, quantize_kv
from loraloom.kernels.lora_stacks import BPanels, PackedStack
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata


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
    check_kv_scales(k_cache, k_scale, v_scale)
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    for cache, source, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
        stored = quantize_kv(source, scale, cache.dtype)
        # Through a byte view: CPU index_copy_ has no float8 kernel, and a copy is a copy.
        flat = cache.view(-1, *cache.shape[2:])
        if cache.dtype.itemsize == 1:
            flat, stored = flat.view(torch.uint8), stored.view(torch.uint8)
        flat.index_copy_(0, slot_mapping, stored)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] rotated by its token's angles, cos/sin [T, 1, head_dim] (the
    "rotate half" layout of Hugging Face Llama checkpoints)."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


def rotary_write_kv_cache(
    query: torch.Tensor,  # [T, H, D], rotated in place
    key: torch.Tensor,  # [T, KVH, D], left as it is
    value: torch.Tensor,  # [T, KVH, D]
    cos: torch.Tensor,  # [T, D]
    sin: torch.Tensor,  # [T, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only
    v_scale: torch.Tensor | None = None,
) -> None:
    """query <- rotary(query); cache[slot_mapping[t]] <- (rotary(key[t]), value[t]) (FP8: / scale, e4m3)."""
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    query.copy_(apply_rotary(query, cos, sin))
    write_kv_cache(apply_rotary(key, cos, sin), value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:length]  # [length, KVH, D]


def paged_attention(
    query: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,  # [1] fp32; an FP8 cache only: K = stored * k_scale
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of each request's new tokens over its whole cached sequence.

    for each request b with n new tokens and L = seq_lens[b] cached tokens:
        new token i sits at position L - n + i and attends cache positions 0 .. L - n + i,
        read through block_tables[b]; query head h uses KV head h // (H // KVH).
    The new tokens' K/V must already be in the cache (write_kv_cache first). An FP8 cache is
    dequantized to the query's dtype (stored * scale) before the products.
    """
    check_kv_scales(k_cache, k_scale, v_scale)
    out = torch.empty_like(query)
    decode_rows = decode_requests(meta)
    if decode_rows:
        _decode_attention(query, k_cache, v_cache, meta, decode_rows, scale, out, k_scale, v_scale)
    prefill_attention(query, k_cache, v_cache, meta, scale, out, k_scale, v_scale)
    return out


def decode_requests(meta: AttentionMetadata) -> list[int]:
    """The requests with exactly one new token this step (decodes)."""
    qsl = meta.query_start_loc_host
    return [b for b in range(meta.num_seqs) if qsl[b + 1] - qsl[b] == 1]


def prefill_attention(query, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor,
                      k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, min_new_tokens: int = 2) -> None:
    """paged_attention's rows of the requests with at least `min_new_tokens` (more than one) new tokens,
    written into out."""
    group = query.shape[1] // k_cache.shape[2]
    qsl, lens = meta.query_start_loc_host, meta.seq_lens_host
    for b in range(meta.num_seqs):
        start, end = qsl[b], qsl[b + 1]
        n = end - start
        if n < max(min_new_tokens, 2):
            continue
        length = lens[b]
        # [length, KVH, D] each
        k = dequantize_kv(_gather_kv(k_cache, meta.block_tables[b], length), k_scale, query.dtype)
        v = dequantize_kv(_gather_kv(v_cache, meta.block_tables[b], length), v_scale, query.dtype)
        if length == n:
            # The whole sequence is new: plain causal attention, which SDPA runs in its fused
            # kernel (skipping the masked half) instead of materializing an [n, n] mask.
            mask, causal = None, True
        else:
            # is_causal would align the triangle top-left; the new tokens sit at the end.
            q_pos = torch.arange(length - n, length).unsqueeze(1)
            mask, causal = torch.arange(length).unsqueeze(0) <= q_pos, False  # [n, length]
        # 4-D [1, heads, tokens, D] with enable_gqa: the layout SDPA's fused CPU kernel accepts,
        # and query head h reads KV head h // group without copying K/V per query head.
        o = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1)[None].to(k.dtype), k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=group > 1,
        )[0]
        out[start:end] = o.transpose(0, 1).to(out.dtype)


def _decode_attention(query, k_cache, v_cache, meta, rows, scale, out, k_scale, v_scale) -> None:
    """All one-token requests at once: their sequences gathered and padded to the longest, masked.

    One SDPA call over [requests, KV heads, group, D] queries: each KV head's query group acts as
    that head's "query length", so K/V are never repeated per query head, and SDPA's fused CPU
    kernel does the products and the softmax (an einsum here cost several times more: it copies
    K into a matmul layout and materializes the scores in separate passes).
    """
    num_heads, kv_heads = query.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    block_size = k_cache.shape[1]
    lens = torch.tensor([meta.seq_lens_host[b] for b in rows])
    max_len = int(lens.max())
    max_blocks = -(-max_len // block_size)
    rows_t = torch.tensor(rows)
    tables = meta.block_tables[rows_t, :max_blocks].long()  # [n, max_blocks]
    # [n, KVH, max_len, D] views of the gathered blocks
    k = dequantize_kv(k_cache[tables].flatten(1, 2)[:, :max_len], k_scale, query.dtype).transpose(1, 2)
    v = dequantize_kv(v_cache[tables].flatten(1, 2)[:, :max_len], v_scale, query.dtype).transpose(1, 2)
    q_rows = torch.tensor([meta.query_start_loc_host[b] for b in rows])
    q = query[q_rows].view(len(rows), kv_heads, group, -1).to(k.dtype)  # [n, KVH, G, D]
    valid = torch.arange(max_len).unsqueeze(0) < lens.unsqueeze(1)  # [n, max_len]; every row has a True
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)  # [n, KVH, G, D]
    out[q_rows] = o.reshape(len(rows), num_heads, -1).to(out.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, hidden] -> weight * rmsnorm(x), [T, hidden] in x's dtype."""
    # The mean of squares in fp32: in bf16 it loses the small components of large-norm rows.
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, residual) [T, hidden] -> (weight * rmsnorm(x + residual), x + residual)."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def sgmv_shrink(
    x: torch.Tensor,  # [T, in_features]
    lora_a: list[torch.Tensor],  # per slice: [S, max_rank, in_features]
    meta: SGMVMetadata,
    out: torch.Tensor,  # [num_slices, T, max_rank]; rows of base tokens are left untouched
) -> None:
    """for each segment a (slot s, rank r), token t in it, slice i:
    out[i, t, :r] = x[t] @ lora_a[i][s, :r].T
    Padding segments (length 0, slot -1) and padding tiles do nothing."""
    for start, length, slot in zip(meta.segment_starts_host, meta.segment_lens_host, meta.active_slots_host):
        if length == 0:
            continue
        rows = meta.sorted_token_ids[start:start + length].long()
        xs = x[rows]
        rank = meta.slot_ranks_host[slot]
        for i, a in enumerate(lora_a):
            out[i, rows, :rank] = xs @ a[slot, :rank].T


def sgmv_expand(
    y: torch.Tensor,  # [num_slices, T, max_rank] from sgmv_shrink
    lora_b: list[torch.Tensor],  # per slice: [S, out_features_i, max_rank], lora scaling folded in
    meta: SGMVMetadata,
    base_out: torch.Tensor,  # [T, sum(out_features_i)], updated in place
    slice_offsets: list[int],  # [num_slices + 1] column offsets of each slice in base_out
) -> None:
    """for each segment a (slot s, rank r), token t in it, slice i:
    base_out[t, off_i:off_{i+1}] += y[i, t, :r] @ lora_b[i][s, :, :r].T
    Padding segments (length 0, slot -1) and padding tiles do nothing."""
    for start, length, slot in zip(meta.segment_starts_host, meta.segment_lens_host, meta.active_slots_host):
        if length == 0:
            continue
        rows = meta.sorted_token_ids[start:start + length].long()
        rank = meta.slot_ranks_host[slot]
        for i, b in enumerate(lora_b):
            lo, hi = slice_offsets[i], slice_offsets[i + 1]
            base_out[rows, lo:hi] += y[i, rows, :rank] @ b[slot, :, :rank].T


def add_lora(
    x: torch.Tensor,  # [T, in_features]
    stack: PackedStack,  # every slot's weights, packed at its own ranks (kernels/lora_stacks.py)
    meta: SGMVMetadata,
    out: torch.Tensor,  # [T, sum(out_features_i)]: the base layer's output, updated in place
    slice_offsets: list[int],  # [num_slices + 1] column offsets of each slice in out
) -> None:
    """LoRA of every adapter token added to the base output: one shrink and one expand per
    targeted slice, per segment.

    for each segment a (slot s), token t in it, slice i that s targets with rank r:
        out[t, off_i:off_{i+1}] += (x[t] @ A_i[s, :r].T) @ B_i[s, :, :r].T

    The work is each segment's tokens times its adapter's own rank in each module it targets: no
    slot, rank padding or untargeted module is computed, and rows outside every segment (base
    tokens, other adapters' tokens) are never written, so they get exactly nothing whatever any
    slot holds. The shrink is one matmul over the slot's packed A (all targeted slices at once);
    a segment whose rows are one contiguous run (meta.segment_rows_host, the usual case: the
    scheduler groups each adapter's requests) works on views and adds in place, otherwise its
    rows are gathered and the result scattered back.
    """
    columns = None  # per slice: its columns of out, made once per call
    for start, length, slot, first_row in zip(meta.segment_starts_host, meta.segment_lens_host,
                                              meta.active_slots_host, meta.segment_rows_host):
        views = stack.slots[slot]
        if length == 0 or views is None:
            continue  # the adapter targets none of this linear's modules
        if columns is None:
            columns = [out[:, lo:hi] for lo, hi in zip(slice_offsets, slice_offsets[1:])]
        if first_row >= 0:
            rows = None
            xs = x.narrow(0, first_row, length)
        else:
            rows = meta.sorted_token_ids[start:start + length].long()
            xs = x[rows]
        # Weights stored narrower than x (EngineConfig.lora_dtype) are widened for the matmul (`.to`
        # is a no-op when the types agree); the compiled CPU op widens them as it reads them instead.
        shrunk = torch.mm(xs, views.a_t.to(x.dtype))  # [n, total rank]
        parts = shrunk.split(views.split, dim=1) if len(views.split) > 1 else (shrunk,)
        for (index, panels), part in zip(views.expands, parts):
            delta = expand_panels(part, panels.to(x.dtype))
            if rows is None:
                columns[index].narrow(0, first_row, length).add_(delta)
            else:
                columns[index].index_add_(0, rows, delta)


def expand_panels(part: torch.Tensor, panels: BPanels) -> torch.Tensor:
    """part [n, r] @ B^T [r, out] over B^T's column panels (kernels/lora_stacks.py): one batched matmul
    over the whole panels and one matmul for the narrower last, on views of the stack (no weight copy)."""
    n = part.shape[0]
    delta = torch.matmul(part, panels.full).transpose(0, 1).reshape(n, -1)  # [panels, n, W] -> [n, panels * W]
    if panels.tail is None:
        return delta
    return torch.cat([delta, part @ panels.tail], dim=1)


def fp8_scaled_mm(
    x_q: torch.Tensor,  # [T, K] float8_e4m3fn
    x_scale: torch.Tensor,  # [T, 1] fp32
    w_q: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N, 1] fp32
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [T, N] in out_dtype
    """torch._scaled_mm with row-wise scales, by dequantizing (kernels/fp8.py holds the CUDA path):

        out[t, n] = sum_k (x_q[t, k] * x_scale[t]) * (w_q[n, k] * w_scale[n])
                  = x_scale[t] * w_scale[n] * sum_k x_q[t, k] * w_q[n, k]

    computed in the second form, like the GEMM's epilogue: each e4m3 x e4m3 product is exact in
    fp32, the sum is accumulated in fp32, and the output is rounded to out_dtype once.
    """
    acc = x_q.float() @ w_q.float().T  # [T, N] fp32
    return acc.mul_(x_scale).mul_(w_scale.T).to(out_dtype)


def dequantized_fp8_mm(
    x: torch.Tensor,  # [T, K] activations already dequantized (fp32)
    w_q: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N, 1] fp32
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [T, N] in out_dtype
    """x @ (w_q * w_scale).T with the weight's scale applied after the fp32 GEMM, as fp8_scaled_mm does."""
    acc = x.float() @ w_q.float().T
    return acc.mul_(w_scale.T).to(out_dtype)
