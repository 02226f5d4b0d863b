"""Which implementation of the per-step ops the model runs on a given device.

Triton kernels on CUDA when Triton is installed; plain torch everywhere else (the CPU path):
the references of kernels/reference.py, except SGMV, whose decode-shaped steps take
kernels/cpu_lora.py's dense form. Importing this module never imports Triton, so the engine
runs on machines without it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from loraloom.kernels import cpu_lora, reference
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata

# K/V writers and attention take (k_scale, v_scale) last: [1] fp32 tensors for an FP8 cache, None
# for a cache in the activation dtype (kernels/kv_quant.py).
Scale = torch.Tensor | None
WriteKVCache = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Scale, Scale], None]
PagedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float, Scale, Scale],
                          torch.Tensor]
SGMVShrink = Callable[[torch.Tensor, list[torch.Tensor], SGMVMetadata, torch.Tensor], None]
SGMVExpand = Callable[[torch.Tensor, list[torch.Tensor], SGMVMetadata, torch.Tensor, list[int]], None]
RotaryWriteKVCache = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor, Scale, Scale], None]
RMSNorm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
FusedAddRMSNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class KernelBackend:
    """One implementation of each op; every one keeps kernels/reference.py's signature."""

    name: str  # "triton", "torch" or "reference"
    write_kv_cache: WriteKVCache
    rotary_write_kv_cache: RotaryWriteKVCache
    paged_attention: PagedAttention
    sgmv_shrink: SGMVShrink
    sgmv_expand: SGMVExpand
    rms_norm: RMSNorm
    fused_add_rms_norm: FusedAddRMSNorm


REFERENCE_BACKEND = KernelBackend(
    name="reference",
    write_kv_cache=reference.write_kv_cache,
    rotary_write_kv_cache=reference.rotary_write_kv_cache,
    paged_attention=reference.paged_attention,
    sgmv_shrink=reference.sgmv_shrink,
    sgmv_expand=reference.sgmv_expand,
    rms_norm=reference.rms_norm,
    fused_add_rms_norm=reference.fused_add_rms_norm,
)


# What runs where Triton does not: the references, with the CPU's dense SGMV for decode steps.
TORCH_BACKEND = replace(REFERENCE_BACKEND, name="torch", sgmv_shrink=cpu_lora.sgmv_shrink,
                        sgmv_expand=cpu_lora.sgmv_expand)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_backend(device: torch.device | str) -> KernelBackend:
    """Triton kernels for a CUDA device when Triton is installed, plain torch (TORCH_BACKEND) otherwise."""
    if torch.device(device).type != "cuda" or not triton_available():
        return TORCH_BACKEND
    # Imported here so that a machine without Triton never imports it.
    from loraloom.kernels import norm, paged_attention, rotary, sgmv

    return KernelBackend(
        name="triton",
        write_kv_cache=paged_attention.write_kv_cache,
        rotary_write_kv_cache=rotary.rotary_write_kv_cache,
        paged_attention=paged_attention.paged_attention,
        sgmv_shrink=sgmv.sgmv_shrink,
        sgmv_expand=sgmv.sgmv_expand,
        rms_norm=norm.rms_norm,
        fused_add_rms_norm=norm.fused_add_rms_norm,
    )
