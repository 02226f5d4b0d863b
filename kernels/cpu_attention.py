"""paged_attention for the CPU backend: decodes through the compiled op (kernels/csrc/paged_decode.cpp)
when it is built and the cache is float32, prefills (and everything else) as kernels/reference.py.

The compiled decode reads each request's K/V blocks in place; the reference gathers them into padded
tensors first, a copy that grows with batch x context and dominated attention in the served mix.
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
    requests = reference.decode_requests(meta)
    if requests:
        compiled.paged_decode_attention(query, k_cache, v_cache, meta.block_tables, requests,
                                        [meta.query_start_loc_host[b] for b in requests],
                                        [meta.seq_lens_host[b] for b in requests], scale, out)
    reference.prefill_attention(query, k_cache, v_cache, meta, scale, out, None, None)
    return out
