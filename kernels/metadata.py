"""Per-step metadata shared by the attention and SGMV kernels and their references.

Built once per step by the model runner (engine/model_runner.py). On the GPU the
tensors live in preallocated buffers so a decode step can be replayed from a CUDA
graph; the `*_host` lists are the same values on the host, for the plain-torch
references and for launch-grid sizing.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    """Tokens grouped by adapter slot. Base-only tokens (slot -1) are in no segment and cost nothing."""

    token_to_slot: torch.Tensor  # [T] int32, -1 = base
    sorted_token_ids: torch.Tensor  # [T_lora] int32: flat-batch rows, grouped by slot, segment after segment
    segment_starts: torch.Tensor  # [A] int32: start of segment a in sorted_token_ids
    segment_lens: torch.Tensor  # [A] int32: tokens of segment a
    active_slots: torch.Tensor  # [A] int32: slot of segment a
    slot_ranks: torch.Tensor  # [S] int32: rank of the adapter in each slot (0 = empty)
    segment_starts_host: list[int]
    segment_lens_host: list[int]
    active_slots_host: list[int]
    slot_ranks_host: list[int]

    @property
    def num_segments(self) -> int:
        return len(self.active_slots_host)
