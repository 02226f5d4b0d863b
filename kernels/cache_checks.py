"""What every kernel that reads or writes the paged KV cache checks of it (paged attention, the K/V
writers, fused rotary + write): one leaf, so that no kernel module imports another's private helper."""
from __future__ import annotations

import torch

from loraloom.kernels.dtypes import FP8_DTYPE

CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, FP8_DTYPE)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride(), (
        f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same shape and layout")
    assert k_cache.dim() == 4 and k_cache.stride(3) == 1, (
        "the KV cache must be [num_blocks, block_size, KVH, D] with contiguous head_dim")
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in CACHE_DTYPES, (
        f"KV cache dtype must be one of {CACHE_DTYPES} (both the same); got {k_cache.dtype}, {v_cache.dtype}")


def check_cache_write(k_cache: torch.Tensor, slot_mapping: torch.Tensor, num_tokens: int, kv_heads: int,
                      head_dim: int) -> None:
    """What every writer of new K/V into the cache checks: the cache's heads match the keys',
    and one int64 slot per new token."""
    assert k_cache.shape[2:] == (kv_heads, head_dim), (
        f"KV cache heads/head_dim {tuple(k_cache.shape[2:])} do not match key's {(kv_heads, head_dim)}")
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64, (
        f"slot_mapping must be [T={num_tokens}] int64; got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
