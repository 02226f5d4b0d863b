"""Where each slot's LoRA weights live for one wrapped linear, in the layout its add_lora wants.

A wrapped linear (qkv, o, gate_up, down) has one slice per PEFT module it fuses. Every slot has
room for every slice at the server's max rank; an adapter fills its own rank in the slices it
targets and leaves the rest empty (rank 0). The layout is built once, when an adapter is loaded,
so the forward pass never copies or re-lays out weights. Two layouts, one per backend:

- SliceStack (Triton, kernels/sgmv.py): per slice A [S, R, in] and B [S, out_i, R], plus a
  [slices, S] rank table the kernels read on the device.
- PackedStack (CPU, kernels/reference.py add_lora): per slot, the A rows of all its targeted
  slices packed at their own ranks, one after another, so one matmul shrinks every slice; B
  transposed per slice and cut into column panels (BPanels) right after them, so that a slot's
  weights for the linear are one run read front to back. Each slot's views are made at load, so a
  forward pass only indexes a list.

Both keep everything past a slot's ranks zero (a slot is cleared before a load), so a smaller
adapter loaded over a larger one leaves no stale columns even for code that reads the padding.

A PackedStack slot may also hold its adapter in a narrower dtype than the stack's (PackedStack.load's
`dtype`): the slot's row is then read as that dtype, so a bfloat16 adapter in a float32 stack
takes half its row and half the bytes a step reads. The compiled op reads each slot's dtype from
`slot_types` (WEIGHT_TYPE_CODES).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from loraloom.kernels import huge_pages
from loraloom.kernels.metadata import SliceRanks

# Per slice: (A [r, in], B [out_i, r]) with the LoRA scaling folded into B, or None (not targeted).
SliceWeights = list[tuple[torch.Tensor, torch.Tensor] | None]

# The weight dtypes a PackedStack slot may hold, as the codes kernels/csrc/packed_lora.cpp reads (WeightType);
# a stack of another dtype (float64, for checks) is read by kernels/reference.py only, and its slots say so.
WEIGHT_TYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
REFERENCE_ONLY_TYPE = -1


def weight_type_code(dtype: torch.dtype) -> int:
    return WEIGHT_TYPE_CODES.get(dtype, REFERENCE_ONLY_TYPE)


def _check_slices(weights: SliceWeights, num_slices: int, max_rank: int) -> None:
    if len(weights) != num_slices:
        raise ValueError(f"lora stack: {len(weights)} slices given for a linear of {num_slices}")
    for pair in weights:
        if pair is not None and pair[0].shape[0] > max_rank:
            raise ValueError(f"lora stack: rank {pair[0].shape[0]} exceeds the pool's max_rank {max_rank}")


@dataclass
class SliceStack:
    """Per slice A [S, R, in] and B [S, out_i, R]; ranks[slice, slot] on the device and the host."""

    holds_narrower_slots: ClassVar[bool] = False  # the Triton kernels read every slot as the stack's dtype
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

    def load(self, slot: int, weights: SliceWeights, dtype: torch.dtype | None = None) -> None:
        """Copy one adapter's slices into `slot`; the Triton kernels read one dtype, so `dtype` must be the stack's."""
        _check_slices(weights, len(self.lora_a), self.lora_a[0].shape[1])
        if dtype not in (None, self.lora_a[0].dtype):
            raise ValueError(f"lora stack: a SliceStack slot holds {self.lora_a[0].dtype}, not {dtype}")
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


# Columns per panel of a slot's transposed B. A decode step reads every slot's weights once, and the
# CPU streams memory fastest front to back: the expand of one token runs down a panel's rows (a
# rank-long run of PANEL_WIDTH-wide rows, contiguous) with the panel's output columns held in
# registers. Reading B^T [r, out] row by row instead keeps several rows' streams open at once, or
# reads and writes the whole output row once per rank; measured on a 2-core EPYC, either is 30-55%
# slower than the panels. 64 columns are four AVX-512 vectors of sums, and whole tiles for the
# reference's batched matmul (kernels/reference.py expand_panels). kernels/csrc/packed_lora.cpp is
# built for this width.
PANEL_WIDTH = 64


@dataclass(frozen=True)
class BPanels:
    """One slot's B for one slice, transposed ([r, out]) and cut into column panels of PANEL_WIDTH: panel
    p holds columns [p * PANEL_WIDTH, ...) as an [r, width] row-major block, and the panels follow each
    other. Views into the stack: `full` [out // PANEL_WIDTH, r, PANEL_WIDTH] and `tail` [r, out % PANEL_WIDTH]
    (None when out is a whole number of panels)."""

    full: torch.Tensor
    tail: torch.Tensor | None

    @classmethod
    def write(cls, region: torch.Tensor, b: torch.Tensor) -> "BPanels":
        """Lay B [out, r] into the flat region (of at least r * out elements) as panels; returns their views."""
        rank, out = b.shape[1], b.shape[0]
        panels = cls.view(region, rank, out)
        whole = panels.full.shape[0] * PANEL_WIDTH
        panels.full.copy_(b[:whole].T.reshape(rank, panels.full.shape[0], PANEL_WIDTH).transpose(0, 1))
        if panels.tail is not None:
            panels.tail.copy_(b[whole:].T)
        return panels

    @classmethod
    def view(cls, region: torch.Tensor, rank: int, out: int) -> "BPanels":
        whole = out // PANEL_WIDTH * PANEL_WIDTH
        tail = region[rank * whole:rank * out].view(rank, out - whole) if out > whole else None
        return cls(region[:rank * whole].view(out // PANEL_WIDTH, rank, PANEL_WIDTH), tail)

    def to(self, dtype: torch.dtype) -> "BPanels":
        return BPanels(self.full.to(dtype), None if self.tail is None else self.tail.to(dtype))

    def dense(self) -> torch.Tensor:
        """B transposed as one [r, out] tensor (a copy: for checks, never for a forward pass)."""
        rank = self.full.shape[1] if self.tail is None else self.tail.shape[0]
        parts = [self.full.transpose(0, 1).reshape(rank, self.full.shape[0] * PANEL_WIDTH)]
        parts += [self.tail] if self.tail is not None else []
        return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class SlotViews:
    """One loaded slot's weights as the CPU add_lora uses them (views into the PackedStack)."""

    a_t: torch.Tensor  # [in, total rank]: every targeted slice's A, transposed, side by side
    split: list[int]  # the total rank split per targeted slice
    expands: list[tuple[int, BPanels]]  # per targeted slice: (slice index, its B)


@dataclass
class PackedStack:
    """Per slot, one row of `weights`: the A rows of its targeted slices packed at their own ranks, then
    each targeted slice's B in panels (BPanels), one after another, then zeros.

    One row rather than A and each slice's B in tensors of their own: a decode step reads a slot's
    weights for a linear as one run of memory instead of one run per part, and a run the hardware
    prefetcher follows to its end is cheaper than several short ones (the op is bound by these reads).
    """

    holds_narrower_slots: ClassVar[bool] = True  # a slot may be read as a narrower dtype (load's `dtype`)
    weights: torch.Tensor  # [S, max_rank * (num_slices * in + sum(out_i))]
    in_features: int
    out_features: list[int]
    max_rank: int
    ranks: torch.Tensor  # [S, slices] int32: each slot's rank per slice (0: untargeted), in packing order
    slot_types: torch.Tensor  # [S] int8: the dtype each slot's row is read as (WEIGHT_TYPE_CODES)
    slots: list[SlotViews | None] = field(default_factory=list)  # None: nothing to add (empty or untargeted)

    @classmethod
    def allocate(cls, num_slots: int, max_rank: int, in_features: int, out_features: list[int],
                 dtype: torch.dtype, device: torch.device | str) -> "PackedStack":
        shape = (num_slots, max_rank * (len(out_features) * in_features + sum(out_features)))
        # A decode step reads short runs all over these: on the CPU, keep them on huge pages.
        on_cpu = torch.device(device).type == "cpu"
        return cls(
            weights=huge_pages.zeros(shape, dtype) if on_cpu else torch.zeros(shape, dtype=dtype, device=device),
            in_features=in_features,
            out_features=list(out_features),
            max_rank=max_rank,
            ranks=torch.zeros(num_slots, len(out_features), dtype=torch.int32),
            slot_types=torch.full((num_slots,), weight_type_code(dtype), dtype=torch.int8),
            slots=[None] * num_slots,
        )

    def tensors(self) -> list[torch.Tensor]:
        return [self.weights]

    def load(self, slot: int, weights: SliceWeights, dtype: torch.dtype | None = None) -> None:
        """Copy one adapter's slices into `slot`, stored as `dtype` (default: the stack's; no wider than it)."""
        _check_slices(weights, len(self.out_features), self.max_rank)
        dtype = dtype or self.weights.dtype
        narrower = dtype in WEIGHT_TYPE_CODES and dtype.itemsize <= self.weights.dtype.itemsize
        if dtype != self.weights.dtype and not narrower:
            raise ValueError(f"lora stack: a slot of a {self.weights.dtype} stack cannot hold {dtype}; use one of "
                             f"{[str(t) for t in WEIGHT_TYPE_CODES if t.itemsize <= self.weights.dtype.itemsize]}")
        self.clear(slot)
        # The slot's row read as `dtype`: a narrower dtype uses the front of it.
        row = self.weights[slot].view(dtype)
        targeted = [(i, pair) for i, pair in enumerate(weights) if pair is not None]
        total = sum(a.shape[0] for _, (a, _b) in targeted)
        a_rows = row[:total * self.in_features].view(total, self.in_features)
        first, offset, split, expands = 0, total * self.in_features, [], []
        for i, (a, b) in targeted:
            rank = a.shape[0]
            a_rows[first:first + rank].copy_(a)
            expands.append((i, BPanels.write(row[offset:offset + rank * self.out_features[i]], b)))
            self.ranks[slot, i] = rank
            split.append(rank)
            first += rank
            offset += rank * self.out_features[i]
        self.slot_types[slot] = weight_type_code(dtype)
        self.slots[slot] = SlotViews(a_rows.T, split, expands) if total else None

    def clear(self, slot: int) -> None:
        self.weights[slot].zero_()
        self.ranks[slot] = 0
        self.slot_types[slot] = weight_type_code(self.weights.dtype)
        self.slots[slot] = None


LoRAStack = SliceStack | PackedStack
