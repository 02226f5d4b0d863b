"""paged_attention for the CPU backend: decodes through the compiled op (kernels/csrc/paged_decode.cpp)
when it is built and the cache is float32, prefills (and everything else) as kernels/reference.py.

The compiled decode reads each request's K/V blocks in place; the reference gathers them into padded
tensors first, a copy that grows with batch x context and dominated attention in the served mix.

A request with a few new tokens (a speculative decoding step verifies its last token and its proposals)
goes through the compiled decode too, one entry per new token: row i of n attends to the positions up to
its own, seq_len - (n - 1 - i), which is causal attention exactly. The reference's per-request gather and
masked SDPA cost more than the few rows' attention itself.
"""
from __future__ import annotations

import torch

from loraloom.kernels import cpu_extension, reference
from loraloom.kernels.metadata import AttentionMetadata


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as kernels/reference.py paged_attention."""
    compiled = cpu_extension.load()
    float32 = query.dtype == k_cache.dtype == v_cache.dtype == torch.float32
    if compiled is None or not float32 or k_scale is not None or query.device.type != "cpu":
        return reference.paged_attention(query, k_cache, v_cache, meta, scale, k_scale, v_scale)
    query = query.contiguous()
    out = torch.empty_like(query)
    requests, rows, lengths = _decode_rows(meta)
    if requests:
        compiled.paged_decode_attention(query, k_cache, v_cache, meta.block_tables, requests, rows, lengths, scale, out)
    reference.prefill_attention(query, k_cache, v_cache, meta, scale, out, None, None,
                                min_new_tokens=MAX_DECODED_NEW_TOKENS + 1)
    return out


# Requests with up to this many new tokens are attended row by row by the compiled decode.
MAX_DECODED_NEW_TOKENS = 16


def _decode_rows(meta: AttentionMetadata) -> tuple[list[int], list[int], list[int]]:
    """(request, query row, length attended) of every new token of the requests with at most
    MAX_DECODED_NEW_TOKENS of them."""
    qsl, lens = meta.query_start_loc_host, meta.seq_lens_host
    requests, rows, lengths = [], [], []
    for b in range(meta.num_seqs):
        start, end = qsl[b], qsl[b + 1]
        if end - start > MAX_DECODED_NEW_TOKENS:
            continue
        for row in range(start, end):
            requests.append(b)
            rows.append(row)
            lengths.append(lens[b] - (end - 1 - row))
    return requests, rows, lengths
