"""SGMV shrink and expand for the CPU: decode-shaped steps as two matmuls over every slot at once.

kernels/reference.py loops over the step's segments and slices; with a decode step's many small
segments that is a few hundred tiny torch ops per LoRA layer, and on a CPU their fixed cost made
LoRA dearer than the base model's own matmuls. Here a step whose segments average fewer than
DENSE_MAX_AVG_ROWS tokens runs each slice as one matmul against all slots' stacked weights
(shrink: x @ A_all.T, then each token keeps its own slot's block; expand: the tokens' shrunk
vectors placed in their own slot's block of a [tokens, slots * rank] matrix, times B_all). That
spends slots-times more FLOPs on a few tokens, which is cheap, instead of per-segment overhead.
Larger segments (prefills) go through the reference loop, whose per-segment matmuls are efficient.

Same signatures and results as the reference; unlike it, the dense path relies on each slot's
weights being zero beyond its rank, which LoRASlotPool guarantees (it zero-pads every slot to
max_rank and clears a slot before loading it).
"""
from __future__ import annotations

import torch

from loraloom.kernels import reference
from loraloom.kernels.metadata import SGMVMetadata

# Segments averaging fewer adapter tokens than this take the dense path (decode steps).
DENSE_MAX_AVG_ROWS = 16


def _dense_rows(meta: SGMVMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(adapter token rows [n], their slots [n]) when the step is decode-shaped; None for the reference loop."""
    num_rows = sum(meta.segment_lens_host)
    if num_rows == 0 or num_rows >= DENSE_MAX_AVG_ROWS * meta.num_segments:
        return None
    rows = meta.sorted_token_ids[:num_rows].long()
    return rows, meta.token_to_slot[rows].long()


def sgmv_shrink(x: torch.Tensor, lora_a: list[torch.Tensor], meta: SGMVMetadata, out: torch.Tensor) -> None:
    """reference.sgmv_shrink's contract: out[i, t, :R] = x[t] @ lora_a[i][slot of t].T for adapter tokens."""
    dense = _dense_rows(meta)
    if dense is None:
        reference.sgmv_shrink(x, lora_a, meta, out)
        return
    rows, slots = dense
    xs = x[rows]  # [n, in]
    picks = torch.arange(len(rows))
    for i, a in enumerate(lora_a):  # a: [S, R, in]
        num_slots, max_rank, _ = a.shape
        every_slot = (xs @ a.reshape(num_slots * max_rank, -1).T).view(len(rows), num_slots, max_rank)
        out[i, rows] = every_slot[picks, slots]  # [n, R]: each token's own slot (zero past its rank)


def sgmv_expand(y: torch.Tensor, lora_b: list[torch.Tensor], meta: SGMVMetadata, base_out: torch.Tensor,
                slice_offsets: list[int]) -> None:
    """reference.sgmv_expand's contract: base_out[t, slice i] += y[i, t, :R] @ lora_b[i][slot of t].T."""
    dense = _dense_rows(meta)
    if dense is None:
        reference.sgmv_expand(y, lora_b, meta, base_out, slice_offsets)
        return
    rows, slots = dense
    picks = torch.arange(len(rows))
    for i, b in enumerate(lora_b):  # b: [S, out_i, R]
        num_slots, out_features, max_rank = b.shape
        placed = y.new_zeros(len(rows), num_slots, max_rank)
        placed[picks, slots] = y[i, rows]  # [n, S, R]: each token's vector in its own slot's block
        delta = placed.view(len(rows), -1) @ b.permute(0, 2, 1).reshape(num_slots * max_rank, out_features)
        base_out[rows, slice_offsets[i]:slice_offsets[i + 1]] += delta
