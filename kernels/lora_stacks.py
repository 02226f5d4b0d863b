"""Where each slot's LoRA weights live for one wrapped linear, in the layout its add_lora wants.

A wrapped linear (qkv, o, gate_up, down) has one slice per PEFT module it fuses. Every slot has
room for every slice at the server's max rank; an adapter fills its own rank in the slices it
targets and leaves the rest empty (rank 0). The layout is built once, when an adapter is loaded,
so the forward pass never copies or re-lays out weights. Two layouts, one per backend:

- SliceStack (Triton, kernels/sgmv.py): per slice A [S, R, in] and B [S, out_i, R], plus a
  [slices, S] rank table the kernels read on the device.
- PackedStack (CPU, kernels/reference.py add_lora): per slot, the A rows of all its targeted
  slices packed at their own ranks, one after another, so one matmul shrinks every slice; B
  transposed per slice ([S, R, out_i]) so each expand reads contiguous rows. Each slot's views
  are made at load, so a forward pass only indexes a list.

Both keep everything past a slot's ranks zero (a slot is cleared before a load), so a smaller
adapter loaded over a larger one leaves no stale columns even for code that reads the padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraloom.kernels.metadata import SliceRanks

# Per slice: (A [r, in], B [out_i, r]) with the LoRA scaling folded into B, or None (not targeted).
SliceWeights = list[tuple[torch.Tensor, torch.Tensor] | None]


def _check_slices(weights: SliceWeights, num_slices: int, max_rank: int) -> None:
    if len(weights) != num_slices:
        raise ValueError(f"lora stack: {len(weights)} slices given for a linear of {num_slices}")
    for pair in weights:
        if pair is not None and pair[0].shape[0] > max_rank:
            raise ValueError(f"lora stack: rank {pair[0].shape[0]} exceeds the pool's max_rank {max_rank}")


@dataclass
class SliceStack:
    """Per slice A [S, R, in] and B [S, out_i, R]; ranks[slice, slot] on the device and the host."""

    lora_a: list[torch.Tensor]
    lora_b: list[torch.Tensor]
    ranks: SliceRanks

    @classmethod
    def allocate(cls, num_slots: int, max_rank: int, in_features: int, out_features: list[int],
                 dtype: torch.dtype, device: torch.device | str) -> "SliceStack":
        return cls(
            lora_a=[torch.zeros(num_slots, max_rank, in_features, dtype=dtype, device=device) for _ in out_features],
            lora_b=[torch.zeros(num_slots, out, max_rank, dtype=dtype, device=device) for out in out_features],
            ranks=SliceRanks(device=torch.zeros(len(out_features), num_slots, dtype=torch.int32, device=device),
                             host=[[0] * num_slots for _ in out_features]),
        )

    def tensors(self) -> list[torch.Tensor]:
        return [*self.lora_a, *self.lora_b]

    def load(self, slot: int, weights: SliceWeights) -> None:
        _check_slices(weights, len(self.lora_a), self.lora_a[0].shape[1])
        self.clear(slot)
        for i, pair in enumerate(weights):
            if pair is None:
                continue
            a, b = pair
            rank = a.shape[0]
            self.lora_a[i][slot, :rank].copy_(a)
            self.lora_b[i][slot, :, :rank].copy_(b)
            self.ranks.device[i, slot] = rank
            self.ranks.host[i][slot] = rank

    def clear(self, slot: int) -> None:
        for stack in (*self.lora_a, *self.lora_b):
            stack[slot].zero_()
        self.ranks.device[:, slot] = 0
        for row in self.ranks.host:
            row[slot] = 0


@dataclass(frozen=True)
class SlotViews:
    """One loaded slot's weights as the CPU add_lora uses them (views into the PackedStack)."""

    a_t: torch.Tensor  # [in, total rank]: every targeted slice's A, transposed, side by side
    split: list[int]  # the total rank split per targeted slice
    expands: list[tuple[int, torch.Tensor]]  # per targeted slice: (slice index, B transposed [r_i, out_i])


@dataclass
class PackedStack:
    """Per slot: A rows of its targeted slices packed at their own ranks; B transposed per slice."""

    lora_a: torch.Tensor  # [S, num_slices * R, in]
    lora_b_t: list[torch.Tensor]  # per slice [S, R, out_i]
    ranks: torch.Tensor  # [S, slices] int32: each slot's rank per slice (0: untargeted), in packing order
    slots: list[SlotViews | None] = field(default_factory=list)  # None: nothing to add (empty or untargeted)

    @classmethod
    def allocate(cls, num_slots: int, max_rank: int, in_features: int, out_features: list[int],
                 dtype: torch.dtype, device: torch.device | str) -> "PackedStack":
        return cls(
            lora_a=torch.zeros(num_slots, len(out_features) * max_rank, in_features, dtype=dtype, device=device),
            lora_b_t=[torch.zeros(num_slots, max_rank, out, dtype=dtype, device=device) for out in out_features],
            ranks=torch.zeros(num_slots, len(out_features), dtype=torch.int32),
            slots=[None] * num_slots,
        )

    def tensors(self) -> list[torch.Tensor]:
        return [self.lora_a, *self.lora_b_t]

    def load(self, slot: int, weights: SliceWeights) -> None:
        max_rank = self.lora_b_t[0].shape[1]
        _check_slices(weights, len(self.lora_b_t), max_rank)
        self.clear(slot)
        row, split, expands = 0, [], []
        for i, pair in enumerate(weights):
            if pair is None:
                continue
            a, b = pair
            rank = a.shape[0]
            self.lora_a[slot, row:row + rank].copy_(a)
            self.lora_b_t[i][slot, :rank].copy_(b.T)
            self.ranks[slot, i] = rank
            split.append(rank)
            expands.append((i, self.lora_b_t[i][slot, :rank]))
            row += rank
        self.slots[slot] = SlotViews(self.lora_a[slot, :row].T, split, expands) if row else None

    def clear(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        for stack in self.lora_b_t:
            stack[slot].zero_()
        self.ranks[slot] = 0
        self.slots[slot] = None


LoRAStack = SliceStack | PackedStack
