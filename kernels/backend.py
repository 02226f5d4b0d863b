"""Which implementation of the per-step ops the model runs on a given device.

Triton kernels on CUDA when Triton is installed; on the CPU the plain-torch references of
kernels/reference.py, with the compiled CPU ops (kernels/csrc/) where they are built.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from loraloom.kernels import cpu_attention, cpu_linear, fp8, packed_lora, reference
from loraloom.kernels.lora_stacks import LoRAStack, PackedStack, SliceStack
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata

# K/V writers and attention take (k_scale, v_scale) last: [1] fp32 tensors for an FP8 cache, None
# for a cache in the activation dtype (kernels/kv_quant.py).
Scale = torch.Tensor | None
WriteKVCache = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Scale, Scale], None]
PagedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float, Scale, Scale],
                          torch.Tensor]
# add_lora(x, stack, meta, out, slice_offsets): every adapter token's LoRA added to out, from the
# weights in the backend's own stack layout (lora_stack, kernels/lora_stacks.py).
AddLoRA = Callable[[torch.Tensor, LoRAStack, SGMVMetadata, torch.Tensor, list[int]], None]
# linear(x, weight): x @ weight.T for a plain (not FP8) weight [out, in].
LinearOp = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# linear_add_lora(x, weight, stack, meta, slice_offsets): linear(x, weight) with add_lora applied to it.
LinearAddLoRA = Callable[[torch.Tensor, torch.Tensor, LoRAStack, SGMVMetadata, list[int]], torch.Tensor]
RotaryWriteKVCache = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor, Scale, Scale], None]
RMSNorm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
FusedAddRMSNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
# fp8_linear(x, w_q, w_scale, input_scale, two_term): kernels/fp8.py's FP8 W8A8 linear.
Fp8LinearOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Scale, bool], torch.Tensor]


@dataclass(frozen=True)
class KernelBackend:
    """One implementation of each op; every one keeps kernels/reference.py's signature."""

    name: str  # "triton", "cpu" or "reference"
    write_kv_cache: WriteKVCache
    rotary_write_kv_cache: RotaryWriteKVCache
    paged_attention: PagedAttention
    lora_stack: type[SliceStack] | type[PackedStack]  # the slot pool's weight layout that add_lora reads
    add_lora: AddLoRA
    linear: LinearOp
    linear_add_lora: LinearAddLoRA
    rms_norm: RMSNorm
    fused_add_rms_norm: FusedAddRMSNorm
    fp8_linear: Fp8LinearOp


def linear_then_add_lora(linear: LinearOp, add_lora: AddLoRA) -> LinearAddLoRA:
    """linear_add_lora as two calls, where no backend op does both at once."""
    def linear_add_lora(x, weight, stack, meta, slice_offsets):
        out = linear(x, weight)
        add_lora(x, stack, meta, out, slice_offsets)
        return out
    return linear_add_lora


REFERENCE_BACKEND = KernelBackend(
    name="reference",
    write_kv_cache=reference.write_kv_cache,
    rotary_write_kv_cache=reference.rotary_write_kv_cache,
    paged_attention=reference.paged_attention,
    lora_stack=PackedStack,
    add_lora=reference.add_lora,
    linear=F.linear,
    linear_add_lora=linear_then_add_lora(F.linear, reference.add_lora),
    rms_norm=reference.rms_norm,
    fused_add_rms_norm=reference.fused_add_rms_norm,
    fp8_linear=fp8.fp8_linear,
)

# What the CPU runs: the references, with the compiled linears, LoRA and decode-attention ops where they are built.
CPU_BACKEND = replace(REFERENCE_BACKEND, name="cpu", add_lora=packed_lora.add_lora, linear=cpu_linear.linear,
                      linear_add_lora=cpu_linear.linear_add_lora, paged_attention=cpu_attention.paged_attention)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_backend(device: torch.device | str) -> KernelBackend:
    """Triton kernels for a CUDA device when Triton is installed, the CPU backend otherwise."""
    if torch.device(device).type != "cuda" or not triton_available():
        return CPU_BACKEND
    # Imported here so that a machine without Triton never imports it.
    from loraloom.kernels import fp8_gemm, fp8_quant, norm, paged_attention, rotary, sgmv

    return KernelBackend(
        name="triton",
        write_kv_cache=paged_attention.write_kv_cache,
        rotary_write_kv_cache=rotary.rotary_write_kv_cache,
        paged_attention=paged_attention.paged_attention,
        lora_stack=SliceStack,
        add_lora=sgmv.add_lora,
        linear=F.linear,
        linear_add_lora=linear_then_add_lora(F.linear, sgmv.add_lora),
        rms_norm=norm.rms_norm,
        fused_add_rms_norm=norm.fused_add_rms_norm,
        fp8_linear=fp8.TritonFp8Linear(
            linear_small_m=fp8_gemm.fp8_linear_small_m,
            quantize_per_token=fp8_quant.quantize_per_token_triton,
            two_term_rows=fp8_quant.two_term_rows_triton,
        ),
    )
