"""add_lora for the CPU backend: the compiled op (kernels/csrc/packed_lora.cpp) when it is built
and the tensors are what it handles (float32 activations; float32, bfloat16 or float16 weights, per slot),
kernels/reference.py's add_lora otherwise.

Both compute the same thing over the same PackedStack; the compiled op only removes the per
(segment, linear) Python and dispatch overhead that dominates a decode step of many adapters.
"""
from __future__ import annotations

import torch

from loraloom.kernels import cpu_extension, reference
from loraloom.kernels.lora_stacks import PANEL_WIDTH, PackedStack
from loraloom.kernels.metadata import SGMVMetadata


def add_lora(x: torch.Tensor, stack: PackedStack, meta: SGMVMetadata, out: torch.Tensor,
             slice_offsets: list[int]) -> None:
    """Same contract as kernels/reference.py add_lora."""
    compiled = cpu_extension.load()
    if compiled is None or x.dtype != torch.float32 or out.dtype != torch.float32 or x.device.type != "cpu":
        reference.add_lora(x, stack, meta, out, slice_offsets)
        return
    if x.stride(-1) != 1:
        x = x.contiguous()
    compiled.packed_add_lora(x, stack.weights, PANEL_WIDTH, stack.ranks, stack.slot_types, out, slice_offsets,
                             meta.segment_table_host, meta.sorted_token_ids)
