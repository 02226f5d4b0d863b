"""The FP8 (e4m3) KV cache's numerics: one fp32 scale for K and one for V per layer (vLLM's layout).

    store:  cache = e4m3(clamp(x / scale, -448, 448))     round to nearest even (kernels/fp8.py's rule)
    read:   x ~= cache * scale

Per-tensor scales, not per token or per head: the cache then stays a plain [blocks, block_size,
KVH, D] array that any writer and reader indexes alike, and the scales are two device scalars per
layer, which a CUDA graph reads by address (nothing is synchronized with the host, and a scale
changed in place before capture is what every replay uses). A cache in the activation dtype
("auto") takes no scales at all. The Triton kernels fold the scales in rather than dequantizing
every element: K's into the softmax scale, V's into the output, which is the same product up to
fp32 rounding.

Where the scales come from (engine/model/kv_scales.py): a checkpoint's `self_attn.k_scale` /
`self_attn.v_scale` when it has them, else a calibration forward at start.
"""
from __future__ import annotations

import torch

from loraloom.kernels.dtypes import FP8_DTYPE, FP8_MAX, quantize_with_scale


def is_fp8_cache(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def check_kv_scales(cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> None:
    """An FP8 cache needs both scales ([1] fp32, on the cache's device); any other cache takes none."""
    if not is_fp8_cache(cache):
        assert k_scale is None and v_scale is None, (
            f"k_scale/v_scale are for an FP8 KV cache; this cache is {cache.dtype}: pass None")
        return
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        assert scale is not None, f"an FP8 KV cache needs {name}: a [1] fp32 tensor (engine/model/kv_scales.py)"
        assert scale.shape == (1,) and scale.dtype == torch.float32 and scale.device == cache.device, (
            f"{name} must be a [1] fp32 tensor on {cache.device}; got {tuple(scale.shape)} {scale.dtype} "
            f"on {scale.device}")


def quantize_kv(x: torch.Tensor, scale: torch.Tensor | None, cache_dtype: torch.dtype) -> torch.Tensor:
    """K or V rows as the cache stores them: e4m3(x / scale) for FP8, else x in the cache's dtype."""
    if scale is None:
        return x.to(cache_dtype)
    return quantize_with_scale(x, scale)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Cache contents as attention reads them: stored * scale in `dtype` (FP8), else as stored."""
    if scale is None:
        return stored
    # The product in at least fp32, rounded to `dtype` once: a scale rounded to bf16 first would
    # differ from the kernels, which multiply by the fp32 scale.
    wide = torch.promote_types(dtype, torch.float32)
    return (stored.to(wide) * scale.to(wide)).to(dtype)


# Calibrated scales map the largest |K| or |V| seen to FP8_MAX / HEADROOM, so values up to
# HEADROOM x larger than the calibration saw still fit before they saturate. e4m3's steps are
# relative (3 mantissa bits) down to 2^-6 x scale = amax / 14336 here, so the headroom costs
# precision only to values far under anything attention weighs. vLLM's dynamic calibration leaves
# a similar margin (scale = amax / 200).
CALIBRATION_HEADROOM = 2.0
MIN_KV_AMAX = 1e-6  # a layer whose K or V is all zeros gets a tiny positive scale, not 0


def scale_for_amax(amax: torch.Tensor) -> torch.Tensor:
    """|max| of K or V seen in calibration ([1] fp32) -> its cache scale."""
    return amax.float().clamp(min=MIN_KV_AMAX) * (CALIBRATION_HEADROOM / FP8_MAX)
