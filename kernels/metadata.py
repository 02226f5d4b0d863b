"""Per-step metadata shared by the attention and SGMV kernels and their references.

Built once per step by the model runner (engine/model_runner.py). On the GPU the
tensors live in preallocated buffers so a decode step can be replayed from a CUDA
graph; the `*_host` lists are the same values on the host, for the plain-torch
references (and, for attention, launch-grid sizing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [B + 1] int32: request b's new tokens are rows [qsl[b], qsl[b+1]) of the flat batch
    seq_lens: torch.Tensor  # [B] int32: tokens in the KV cache for b after this step's writes (context + new)
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32: physical block ids, padded with 0
    slot_mapping: torch.Tensor  # [T] int64: flat cache slot (block_id * block_size + offset) of each new token
    query_start_loc_host: list[int]
    seq_lens_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)


@dataclass
class SGMVMetadata:
    """Tokens grouped by adapter slot, and the row tiles the SGMV kernels run over.

    Base-only tokens (slot -1) are in no segment and cost nothing. Every array may be padded to a
    fixed capacity (kernels/sgmv_plan.py builds them, padded or exact): padding segments have
    length 0 and slot -1, padding tiles have segment -1, sorted_token_ids may run past the
    adapter tokens. The Triton launchers size their grids from these SHAPES only, never from the
    values, so a captured CUDA graph replays correctly after the buffers are refreshed in place.
    """

    token_to_slot: torch.Tensor  # [T] int32, -1 = base
    sorted_token_ids: torch.Tensor  # [>= T_lora] int32: flat-batch rows, grouped by slot, segment after segment
    segment_starts: torch.Tensor  # [A] int32: start of segment a in sorted_token_ids
    segment_lens: torch.Tensor  # [A] int32: tokens of segment a (0 = padding)
    active_slots: torch.Tensor  # [A] int32: slot of segment a (-1 = padding)
    tile_segments: torch.Tensor  # [N] int32: segment of each tile_rows-row tile (-1 = padding: the program exits)
    tile_row_starts: torch.Tensor  # [N] int32: first row of the tile inside its segment
    slot_ranks: torch.Tensor  # [S] int32: rank of the adapter in each slot (0 = empty)
    tile_rows: int  # rows per tile: the kernels' BLOCK_M
    num_segments: int  # real (non-padding) segments; 0 = a base-only step
    # The same values on the host (padding included), for the plain-torch references.
    segment_starts_host: list[int]
    segment_lens_host: list[int]
    active_slots_host: list[int]
    slot_ranks_host: list[int]
    # First flat-batch row of each segment whose rows are one contiguous run, else -1. The scheduler
    # groups each adapter's requests together, so a plain-torch LoRA can work on row ranges (views)
    # instead of gathering and scattering rows.
    segment_rows_host: list[int]
    # [4, A] int64 on the host: segment_starts_host, segment_lens_host, active_slots_host and
    # segment_rows_host as the rows of one tensor, which the compiled CPU ops take as one argument
    # (converting four Python lists cost each of a step's ~120 calls several microseconds).
    segment_table_host: torch.Tensor


@dataclass
class SliceRanks:
    """The rank each slot's adapter has in each output slice of one LoRA-wrapped linear.

    0 means the adapter does not target that module (or the slot is empty): the slice costs nothing
    for its tokens. A slot's ranks differ per module when the adapter targets a subset of modules
    or uses PEFT's rank_pattern. The adapter slot pool owns these and updates them in place when it
    loads or clears a slot.
    """

    device: torch.Tensor  # [num_slices, S] int32: what the kernels read
    host: list[list[int]]  # [num_slices][S]: the same values, for the plain-torch path


def segment_table(starts: Sequence[int], lens: Sequence[int], slots: Sequence[int],
                  first_rows: Sequence[int]) -> torch.Tensor:
    """SGMVMetadata.segment_table_host from its four host lists: [4, A] int64 on the host."""
    return torch.tensor([list(starts), list(lens), list(slots), list(first_rows)], dtype=torch.int64)
