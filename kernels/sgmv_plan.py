"""Host-side planning of one step's SGMV metadata, in numpy: segments, row tiles, padding, packing.

A plan groups the step's tokens by adapter slot (ascending slot, batch order within a slot) and
cuts each segment into tiles of `tile_rows` rows (the kernels' BLOCK_M). All per-step int32
fields live in ONE contiguous numpy array, in the fixed order of SGMVLayout.FIELDS, each field a
view of it. Two uses:

- eager: `plan.to_metadata(device)` copies that array to the device once and returns
  SGMVMetadata whose tensors are views of the copy (one host-to-device copy per step);
- CUDA graphs: build every plan of a captured batch size with the same capacities
  (`plan_sgmv(..., max_segments=, max_tiles=)`, token_slots padded with -1 to the batch size),
  keep one static device int32 buffer of `layout.size` elements, build the captured metadata
  once with `metadata_views(buffer, plan)`, and before each replay refresh the buffer with a
  single `buffer.copy_(torch.from_numpy(plan.packed))`. The kernels size their grids from the
  capacities only, so the replay reads the new values. (The host lists of metadata built once
  for capture describe the capture step; the kernels never read them.)

Everything here is vectorized numpy: no Python loop over tokens, segments or tiles.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import torch

from loraloom.kernels.metadata import SGMVMetadata, segment_table

# Rows per tile: the M of one m16n8k16 tensor-core MMA. A decode batch of one-token segments
# wastes rows only inside its own 16-row tile. Must be a power of two >= 16 (tl.dot's minimum).
SGMV_TILE_ROWS = 16


def segment_capacity(num_tokens: int, num_slots: int) -> int:
    """Most segments a step of num_tokens tokens over num_slots slots can have: one per used slot."""
    return min(num_tokens, num_slots)


def tile_capacity(num_tokens: int, max_segments: int, tile_rows: int = SGMV_TILE_ROWS) -> int:
    """Most row tiles num_tokens adapter tokens in at most max_segments segments can need (exact).

    A segment cut into c tiles holds at least (c - 1) * tile_rows + 1 tokens, so k segments and
    N tiles need at least (N - k) * tile_rows + k tokens: N <= k + (T - k) // tile_rows, which
    grows with k (for k >= 1). The bound is reached at k = min(max_segments, T): k - 1 one-token segments and
    one segment holding the remaining T - k + 1 tokens.
    """
    if num_tokens < 0 or max_segments < 0:
        raise ValueError(f"tile_capacity: num_tokens ({num_tokens}) and max_segments ({max_segments}) must be >= 0")
    segments = min(max_segments, num_tokens)
    if segments == 0:
        return 0  # no segment, no tile (the formula below assumes at least one)
    return segments + (num_tokens - segments) // tile_rows


@dataclass(frozen=True)
class SGMVLayout:
    """Capacities of a plan and where each field sits in the packed int32 array."""

    num_tokens: int  # T: token_to_slot and sorted_token_ids
    max_segments: int  # A: segment_starts, segment_lens, active_slots
    max_tiles: int  # N: tile_segments, tile_row_starts
    num_slots: int  # S: slot_ranks
    tile_rows: int = SGMV_TILE_ROWS

    FIELDS = ("token_to_slot", "sorted_token_ids", "segment_starts", "segment_lens", "active_slots",
              "tile_segments", "tile_row_starts", "slot_ranks")

    def field_sizes(self) -> dict[str, int]:
        t, a, n = self.num_tokens, self.max_segments, self.max_tiles
        return dict(token_to_slot=t, sorted_token_ids=t, segment_starts=a, segment_lens=a, active_slots=a,
                    tile_segments=n, tile_row_starts=n, slot_ranks=self.num_slots)

    @cached_property  # a frozen dataclass still lets cached_property fill its __dict__
    def field_slices(self) -> dict[str, slice]:
        """name -> slice of the packed array, in FIELDS order."""
        slices, offset = {}, 0
        for name, size in self.field_sizes().items():
            slices[name] = slice(offset, offset + size)
            offset += size
        return slices

    @property
    def size(self) -> int:
        """int32 elements of the packed array."""
        return sum(self.field_sizes().values())


@dataclass
class SGMVPlan:
    """One step's SGMV metadata on the host: every field is a view of `packed` (padding included)."""

    layout: SGMVLayout
    packed: np.ndarray  # [layout.size] int32
    num_segments: int  # real segments (the rest of the segment arrays is padding)
    num_tiles: int  # real tiles

    def field(self, name: str) -> np.ndarray:
        return self.packed[self.layout.field_slices[name]]

    def contiguous_segment_rows(self) -> np.ndarray:
        """[max_segments]: first flat-batch row of each segment whose rows are one run, else -1 (padding too)."""
        rows = np.full(self.layout.max_segments, -1, dtype=np.int64)
        if self.num_segments == 0:
            return rows
        starts = self.field("segment_starts")[:self.num_segments].astype(np.int64)
        lens = self.field("segment_lens")[:self.num_segments].astype(np.int64)
        sorted_rows = self.field("sorted_token_ids")
        first, last = sorted_rows[starts], sorted_rows[starts + lens - 1]
        # Rows within a segment ascend (stable sort), so a run is exactly last - first == len - 1.
        rows[:self.num_segments] = np.where(last - first == lens - 1, first, -1)
        return rows

    def to_metadata(self, device: torch.device | str) -> SGMVMetadata:
        """SGMVMetadata on `device`: one copy of the packed array, every tensor a view of it."""
        return metadata_views(torch.from_numpy(self.packed).to(device), self)


def metadata_views(buffer: torch.Tensor, plan: SGMVPlan) -> SGMVMetadata:
    """SGMVMetadata whose tensors are views of `buffer` (a flat int32 tensor holding plan.packed's layout).

    The host lists and counts are taken from `plan`; the buffer may hold another step's values
    of the same layout (a CUDA graph's static buffer), which is what the kernels will read.
    """
    layout = plan.layout
    if buffer.dtype != torch.int32 or buffer.dim() != 1 or buffer.numel() != layout.size or not buffer.is_contiguous():
        raise ValueError(f"sgmv metadata buffer must be a contiguous 1-D int32 tensor of {layout.size} elements "
                         f"(SGMVLayout.size); got {buffer.dtype} of shape {tuple(buffer.shape)}")
    views = {name: buffer[part] for name, part in layout.field_slices.items()}
    starts, lens = plan.field("segment_starts").tolist(), plan.field("segment_lens").tolist()
    slots, rows = plan.field("active_slots").tolist(), plan.contiguous_segment_rows().tolist()
    return SGMVMetadata(
        **views,
        tile_rows=layout.tile_rows,
        num_segments=plan.num_segments,
        segment_starts_host=starts,
        segment_lens_host=lens,
        active_slots_host=slots,
        slot_ranks_host=plan.field("slot_ranks").tolist(),
        segment_rows_host=rows,
        segment_table_host=segment_table(starts, lens, slots, rows),
    )


def _check_token_slots(slots: np.ndarray, ranks: np.ndarray) -> None:
    """Every token is base (-1) or maps to a loaded slot; the error names the first bad token."""
    in_range = (slots >= -1) & (slots < len(ranks))
    loaded = np.zeros_like(in_range)
    loaded[in_range] = (slots[in_range] == -1) | (ranks[np.maximum(slots[in_range], 0)] > 0)
    if not loaded.all():
        row = int(np.flatnonzero(~loaded)[0])
        raise ValueError(f"sgmv metadata: token {row} maps to slot {int(slots[row])}, which is not a loaded slot "
                         f"(slot ranks {ranks.tolist()}); load the adapter into its slot before scheduling it")


def _capacity(name: str, needed: int, capacity: int | None) -> int:
    if capacity is None:
        return needed
    if needed > capacity:
        raise ValueError(f"sgmv metadata: the step needs {needed} {name} but {name} capacity is {capacity}; "
                         f"raise it (tile_capacity / segment_capacity give the bound for a batch size)")
    return capacity


def plan_sgmv(
    token_slots: Sequence[int] | np.ndarray,  # [T]: adapter slot of each flat-batch token, -1 = base
    slot_ranks: Sequence[int] | np.ndarray,  # [S]: rank of the adapter in each slot, 0 = empty
    *,
    max_segments: int | None = None,  # segment capacity; None = exactly the step's segments
    max_tiles: int | None = None,  # tile capacity; None = exactly the step's tiles
    tile_rows: int = SGMV_TILE_ROWS,
) -> SGMVPlan:
    """Group the step's tokens by slot and cut the segments into tiles, padded to the capacities."""
    if tile_rows < 16 or tile_rows & (tile_rows - 1):
        raise ValueError(f"sgmv metadata: tile_rows must be a power of two >= 16 (tl.dot's smallest M); "
                         f"got {tile_rows}")
    slots = np.asarray(token_slots, dtype=np.int64).reshape(-1)
    ranks = np.asarray(slot_ranks, dtype=np.int64).reshape(-1)
    _check_token_slots(slots, ranks)

    lora_rows = np.flatnonzero(slots >= 0)
    # A stable sort by slot keeps batch order within a segment.
    sorted_rows = lora_rows[np.argsort(slots[lora_rows], kind="stable")]
    counts = np.bincount(slots[lora_rows], minlength=len(ranks))
    active = np.flatnonzero(counts)
    lens = counts[active]
    starts = np.cumsum(lens) - lens
    tiles_per_segment = -(-lens // tile_rows)
    num_segments, num_tiles = len(active), int(tiles_per_segment.sum())

    layout = SGMVLayout(
        num_tokens=len(slots),
        max_segments=_capacity("segments", num_segments, max_segments),
        max_tiles=_capacity("tiles", num_tiles, max_tiles),
        num_slots=len(ranks),
        tile_rows=tile_rows,
    )
    plan = SGMVPlan(layout, np.zeros(layout.size, dtype=np.int32), num_segments, num_tiles)
    plan.field("token_to_slot")[:] = slots
    plan.field("sorted_token_ids")[:len(sorted_rows)] = sorted_rows  # the rest: row 0, never read
    # Padding segments: length 0 at the end of the adapter tokens, slot -1.
    plan.field("segment_starts")[:] = len(sorted_rows)
    plan.field("segment_starts")[:num_segments] = starts
    plan.field("segment_lens")[:num_segments] = lens
    plan.field("active_slots")[:] = -1
    plan.field("active_slots")[:num_segments] = active
    # Tile i of segment a starts at row (i - first tile of a) * tile_rows of the segment.
    tile_segments = np.repeat(np.arange(num_segments), tiles_per_segment)
    first_tile = np.cumsum(tiles_per_segment) - tiles_per_segment
    plan.field("tile_segments")[:] = -1
    plan.field("tile_segments")[:num_tiles] = tile_segments
    plan.field("tile_row_starts")[:num_tiles] = (np.arange(num_tiles) - first_tile[tile_segments]) * tile_rows
    plan.field("slot_ranks")[:] = ranks
    return plan
