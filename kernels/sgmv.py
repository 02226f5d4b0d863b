"""Triton SGMV (segmented gather matrix-vector) kernels: the LoRA shrink and expand steps.

Tokens come grouped by adapter slot (SGMVMetadata): segment a holds the flat-batch rows
sorted_token_ids[segment_starts[a] : segment_starts[a] + segment_lens[a]], all using slot
active_slots[a]. Base-only tokens are in no segment and cost nothing.

Launch grid, both ops: (tiles [x output tiles or K splits], slices). The tile table of the
metadata cuts each segment into tiles of meta.tile_rows rows (BLOCK_M, 16 by default: the M of
one tensor-core MMA), so a decode batch of many one-token segments wastes rows only inside its
own tile, and uneven segments launch no program for rows they do not have. The grid depends
only on the SHAPES of the metadata (its tile capacity), never on its values: a CUDA graph
captured once replays with any metadata of the same capacities, and padding tiles (segment -1)
exit at once.

Slices (q/k/v of a fused projection, or gate/up) share one launch. Their weights arrive as
separate tensors, so the kernels take up to MAX_SLICES weight pointers as plain arguments and
each program picks its own by slice index. Stacking the weights would copy them every call, and
a device table of data pointers would need a host-to-device copy (or a global cache) per call,
which breaks CUDA-graph capture; plain pointer arguments need neither.

Mixed ranks and module subsets: each launch takes the rank every slot has in every slice
(SliceRanks: per module, 0 where the adapter does not target it). A program whose slot has rank 0
in its slice exits before reading any weight, and loads and stores are masked to the slot's own
rank, so a rank-8 adapter reads and writes only its 8 rows of weights and an attention-only
adapter costs nothing in the MLP. The grids depend on the step's tile capacity and the output
width, never on the number of slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from loraloom.kernels.lora_stacks import SliceStack
from loraloom.kernels.metadata import SGMVMetadata

MAX_SLICES = 3  # q, k, v: the widest fused projection in a Llama layer


# Defaults measured by benchmarks/gpusuite/sgmv_sweep.py on an H100 (2026-11-22, BENCHMARKS.md),
# the best geometric mean over 16 decode and prefill shapes of the Llama-3.1-8B projections:
# - shrink: 256-wide K steps and up to 2112 programs (16 per SM, split K): 632 GB/s mean, against
#   ~390 GB/s for the first version's 64-wide steps and 264 programs (one program per SM left
#   little in flight at decode);
# - expand: 64-wide N tiles, 4 warps: 977 GB/s mean; wider tiles (256/512 columns) were slower on
#   every shape (fewer programs per SM to hide the metadata and rank loads).
@dataclass(frozen=True)
class ShrinkConfig:
    """Tuning knobs of sgmv_shrink."""

    block_k: int = 256  # input features per step of the K loop
    num_warps: int = 4
    num_stages: int | None = None  # None: Triton's default software pipelining depth
    # Split K until about this many programs run (16 per H100 SM) when a step has few tiles;
    # chosen from the tile capacity, so a CUDA graph's grid is fixed.
    target_programs: int = 2112
    max_split_k: int = 16


@dataclass(frozen=True)
class ExpandConfig:
    """Tuning knobs of sgmv_expand."""

    block_n: int = 64  # output features per program
    num_warps: int = 4
    num_stages: int | None = None


DEFAULT_SHRINK = ShrinkConfig()
DEFAULT_EXPAND = ExpandConfig()


def _launch_options(config: ShrinkConfig | ExpandConfig) -> dict[str, int]:
    options = {"num_warps": config.num_warps}
    if config.num_stages is not None:
        options["num_stages"] = config.num_stages
    return options


@triton.jit
def _select_slice(slice_id, v0, v1, v2):
    """The argument of slice slice_id (0, 1 or 2): a pointer or a scalar."""
    value = v0
    if slice_id == 1:
        value = v1
    if slice_id == 2:
        value = v2
    return value


@triton.jit
def _tile_rows(tile_row_starts_ptr, sorted_token_ids_ptr, segment_starts_ptr, segment_lens_ptr,
               active_slots_ptr, tile, segment, BLOCK_M: tl.constexpr):
    """Slot, flat-batch rows and row mask of one (non-padding) tile of the tile table."""
    segment_len = tl.load(segment_lens_ptr + segment)
    offs_m = tl.load(tile_row_starts_ptr + tile) + tl.arange(0, BLOCK_M)
    row_mask = offs_m < segment_len
    segment_start = tl.load(segment_starts_ptr + segment)
    rows = tl.load(sorted_token_ids_ptr + segment_start + offs_m, mask=row_mask, other=0)
    slot = tl.load(active_slots_ptr + segment)
    return slot, rows.to(tl.int64), row_mask


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr,  # [T, in_features]
    a0_ptr, a1_ptr, a2_ptr,  # per slice: [S, max_rank, in_features]
    target_ptr,  # [split_k, num_slices, T, max_rank]
    tile_segments_ptr, tile_row_starts_ptr,
    sorted_token_ids_ptr, segment_starts_ptr, segment_lens_ptr, active_slots_ptr,
    ranks_ptr, stride_r_slice,  # ranks[slice, slot]: the slot's rank in this slice (0: not targeted)
    in_features, k_per_split, split_k,
    stride_x_row, stride_x_col,
    stride_a_slot, stride_a_rank, stride_a_col,
    stride_t_split, stride_t_slice, stride_t_row, stride_t_col,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    slice_id = tl.program_id(1)
    tile = pid // split_k
    k_split = pid % split_k
    segment = tl.load(tile_segments_ptr + tile)
    if segment < 0:
        return  # a padding tile
    slot, rows, row_mask = _tile_rows(tile_row_starts_ptr, sorted_token_ids_ptr, segment_starts_ptr,
                                      segment_lens_ptr, active_slots_ptr, tile, segment, BLOCK_M)
    rank = tl.load(ranks_ptr + slice_id * stride_r_slice + slot)
    if rank == 0:
        return  # the adapter does not target this module: no weight is read

    a_ptr = _select_slice(slice_id, a0_ptr, a1_ptr, a2_ptr)
    offs_n = tl.arange(0, BLOCK_N)
    rank_mask = offs_n < rank
    x_rows = x_ptr + rows[:, None] * stride_x_row  # [BLOCK_M, 1]
    a_cols = a_ptr + slot.to(tl.int64) * stride_a_slot + offs_n[None, :] * stride_a_rank  # [1, BLOCK_N]

    k_begin = k_split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, in_features)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        x_tile = tl.load(x_rows + offs_k[None, :] * stride_x_col,
                         mask=row_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        a_tile = tl.load(a_cols + offs_k[:, None] * stride_a_col,
                         mask=k_mask[:, None] & rank_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        # "ieee" keeps fp32 inputs exact (no TF32); fp16/bf16 inputs ignore it.
        acc += tl.dot(x_tile, a_tile, input_precision="ieee")

    target = (target_ptr + k_split * stride_t_split + slice_id * stride_t_slice
              + rows[:, None] * stride_t_row + offs_n[None, :] * stride_t_col)
    tl.store(target, acc.to(target_ptr.dtype.element_ty), mask=row_mask[:, None] & rank_mask[None, :])


@triton.jit
def _sgmv_shrink_reduce_kernel(
    partial_ptr,  # [split_k, num_slices, T, max_rank] fp32
    out_ptr,  # [num_slices, T, max_rank]
    tile_segments_ptr, tile_row_starts_ptr,
    sorted_token_ids_ptr, segment_starts_ptr, segment_lens_ptr, active_slots_ptr,
    ranks_ptr, stride_r_slice,
    split_k,
    stride_p_split, stride_p_slice, stride_p_row,
    stride_o_slice, stride_o_row,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    tile = tl.program_id(0)
    slice_id = tl.program_id(1)
    segment = tl.load(tile_segments_ptr + tile)
    if segment < 0:
        return  # a padding tile
    slot, rows, row_mask = _tile_rows(tile_row_starts_ptr, sorted_token_ids_ptr, segment_starts_ptr,
                                      segment_lens_ptr, active_slots_ptr, tile, segment, BLOCK_M)
    rank = tl.load(ranks_ptr + slice_id * stride_r_slice + slot)
    if rank == 0:
        return
    offs_n = tl.arange(0, BLOCK_N)
    mask = row_mask[:, None] & (offs_n < rank)[None, :]
    partial = partial_ptr + slice_id * stride_p_slice + rows[:, None] * stride_p_row + offs_n[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_split in range(split_k):
        total += tl.load(partial + k_split * stride_p_split, mask=mask, other=0.0)
    out = out_ptr + slice_id * stride_o_slice + rows[:, None] * stride_o_row + offs_n[None, :]
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=mask)


# Triton turns an int argument equal to 1 into a compile-time constant; _select_slice needs the
# per-slice values to share one runtime type.
@triton.jit(do_not_specialize=["out_features0", "out_features1", "out_features2",
                               "col_offset0", "col_offset1", "col_offset2"])
def _sgmv_expand_kernel(
    y_ptr,  # [num_slices, T, max_rank]
    b0_ptr, b1_ptr, b2_ptr,  # per slice: [S, out_features_i, max_rank]
    base_out_ptr,  # [T, sum(out_features_i)]
    out_features0, out_features1, out_features2,
    col_offset0, col_offset1, col_offset2,
    tile_segments_ptr, tile_row_starts_ptr,
    sorted_token_ids_ptr, segment_starts_ptr, segment_lens_ptr, active_slots_ptr,
    ranks_ptr, stride_r_slice,
    max_rank, n_tiles,
    stride_y_slice, stride_y_row,
    stride_o_row,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    slice_id = tl.program_id(1)
    # Programs of one row tile are adjacent, so they walk one adapter's lora_b rows in order.
    tile = pid // n_tiles
    n_start = (pid % n_tiles) * BLOCK_N
    out_features = _select_slice(slice_id, out_features0, out_features1, out_features2)
    if n_start >= out_features:
        return
    segment = tl.load(tile_segments_ptr + tile)
    if segment < 0:
        return  # a padding tile
    slot, rows, row_mask = _tile_rows(tile_row_starts_ptr, sorted_token_ids_ptr, segment_starts_ptr,
                                      segment_lens_ptr, active_slots_ptr, tile, segment, BLOCK_M)
    rank = tl.load(ranks_ptr + slice_id * stride_r_slice + slot)
    if rank == 0:
        return  # the adapter does not target this module: base_out keeps the base value

    b_ptr = _select_slice(slice_id, b0_ptr, b1_ptr, b2_ptr)
    col_offset = _select_slice(slice_id, col_offset0, col_offset1, col_offset2)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < out_features
    k_mask = offs_k < rank

    y_tile = tl.load(y_ptr + slice_id * stride_y_slice + rows[:, None] * stride_y_row + offs_k[None, :],
                     mask=row_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
    # lora_b[i] is contiguous, so slot s starts out_features * max_rank elements after slot s-1.
    b_slot = b_ptr + slot.to(tl.int64) * out_features * max_rank
    b_tile = tl.load(b_slot + offs_n[None, :] * max_rank + offs_k[:, None],
                     mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
    delta = tl.dot(y_tile, b_tile, input_precision="ieee")  # [BLOCK_M, BLOCK_N] fp32

    out = base_out_ptr + rows[:, None] * stride_o_row + (col_offset + offs_n)[None, :]
    mask = row_mask[:, None] & n_mask[None, :]
    current = tl.load(out, mask=mask, other=0.0)
    tl.store(out, (current.to(tl.float32) + delta).to(base_out_ptr.dtype.element_ty), mask=mask)


def _rank_block(max_rank: int) -> int:
    """Tile width covering every rank in the batch; the expand's tl.dot needs K >= 16 for 16-bit inputs."""
    return max(16, triton.next_power_of_2(max_rank))


def _check_metadata(meta: SGMVMetadata, device: torch.device, num_slots: int) -> None:
    for name in ("sorted_token_ids", "segment_starts", "segment_lens", "active_slots", "tile_segments",
                 "tile_row_starts", "slot_ranks"):
        tensor = getattr(meta, name)
        assert tensor.dtype == torch.int32 and tensor.device == device and tensor.is_contiguous(), (
            f"SGMVMetadata.{name} must be a contiguous int32 tensor on {device}; "
            f"got {tensor.dtype} on {tensor.device}")
    assert meta.tile_segments.shape == meta.tile_row_starts.shape, (
        f"SGMVMetadata.tile_segments {tuple(meta.tile_segments.shape)} and tile_row_starts "
        f"{tuple(meta.tile_row_starts.shape)} must have one entry per tile; build them with plan_sgmv")
    assert meta.slot_ranks.shape[0] == num_slots, (
        f"SGMVMetadata.slot_ranks has {meta.slot_ranks.shape[0]} slots, the LoRA weights have {num_slots}")
    assert meta.tile_rows >= 16 and meta.tile_rows & (meta.tile_rows - 1) == 0, (
        f"SGMVMetadata.tile_rows must be a power of two >= 16, got {meta.tile_rows}")


def _check_slices(name: str, weights: list[torch.Tensor], activations: torch.Tensor) -> None:
    assert 1 <= len(weights) <= MAX_SLICES, (
        f"{name}: 1 to {MAX_SLICES} slices per launch, got {len(weights)}; split the call into groups")
    for i, weight in enumerate(weights):
        assert weight.dim() == 3 and weight.is_contiguous(), (
            f"{name}[{i}] must be a contiguous [slots, ., .] tensor; got shape {tuple(weight.shape)}")
        assert weight.dtype == activations.dtype and weight.device == activations.device, (
            f"{name}[{i}] is {weight.dtype} on {weight.device} but the activations are "
            f"{activations.dtype} on {activations.device}: keep LoRA weights in the activation dtype")
        assert weight.shape[0] == weights[0].shape[0], f"{name}[{i}] has a different number of slots"


def _ranks_table(slice_ranks: torch.Tensor | None, meta: SGMVMetadata, num_slices: int,
                 num_slots: int) -> tuple[torch.Tensor, int]:
    """(ranks tensor, its slice stride): slice_ranks [num_slices, S], or every slice reading the slot's rank."""
    if slice_ranks is None:
        return meta.slot_ranks, 0
    assert slice_ranks.shape == (num_slices, num_slots) and slice_ranks.dtype == torch.int32, (
        f"slice_ranks must be an int32 [num_slices={num_slices}, slots={num_slots}] tensor; "
        f"got {slice_ranks.dtype} of shape {tuple(slice_ranks.shape)}")
    assert slice_ranks.stride(1) == 1 and slice_ranks.device == meta.slot_ranks.device, (
        "slice_ranks must have contiguous rows and live with the metadata")
    return slice_ranks, slice_ranks.stride(0)


def choose_split_k(num_tiles: int, num_slices: int, in_features: int,
                   config: ShrinkConfig = DEFAULT_SHRINK) -> int:
    """K splits for the shrink, from shapes only (the tile capacity, not the tiles in use):
    enough programs to fill the GPU, at least one K step per split."""
    programs = max(1, num_tiles * num_slices)
    k_steps = triton.cdiv(in_features, config.block_k)
    return max(1, min(config.max_split_k, k_steps, config.target_programs // programs))


def sgmv_shrink(
    x: torch.Tensor,  # [T, in_features]
    lora_a: list[torch.Tensor],  # per slice: [S, max_rank, in_features]
    meta: SGMVMetadata,
    out: torch.Tensor,  # [num_slices, T, max_rank]; rows of base tokens are left untouched
    slice_ranks: torch.Tensor | None = None,  # [num_slices, S] int32; None: every slice has the slot's rank
    *,
    split_k: int | None = None,  # None: choose_split_k's heuristic
    config: ShrinkConfig = DEFAULT_SHRINK,
) -> None:
    """LoRA down-projection of every adapter token, all slices in one launch.

    for each segment a (slot s), token t in it, slice i with rank r (slice_ranks[i, s]) > 0:
        out[i, t, :r] = x[t] @ lora_a[i][s, :r].T
    Everything else in out is left as it was.

    With split_k > 1 the K (in_features) loop is cut into split_k ranges run by separate
    programs; their fp32 partial sums go to a workspace and a second kernel adds them, which
    keeps the result deterministic and lets out have any float dtype.
    """
    num_tokens, in_features = x.shape
    _check_slices("lora_a", lora_a, x)
    num_slots, max_rank, a_in = lora_a[0].shape
    assert all(a.shape == lora_a[0].shape for a in lora_a), "lora_a: every slice must have the same shape"
    assert a_in == in_features, f"lora_a has in_features {a_in}, x has {in_features}"
    assert out.shape == (len(lora_a), num_tokens, max_rank), (
        f"out must be [num_slices={len(lora_a)}, T={num_tokens}, max_rank={max_rank}]; got {tuple(out.shape)}")
    assert out.is_contiguous() and out.device == x.device, "out must be contiguous and on x's device"
    _check_metadata(meta, x.device, num_slots)
    num_tiles = meta.tile_segments.shape[0]
    if num_tiles == 0:
        return  # no tile capacity (a base-only step): launch nothing

    num_slices = len(lora_a)
    if split_k is None:
        split_k = choose_split_k(num_tiles, num_slices, in_features, config)
    assert split_k >= 1, f"split_k must be >= 1, got {split_k}"
    # Whole BLOCK_K steps per split, so only the last split sees a ragged end.
    k_per_split = triton.cdiv(triton.cdiv(in_features, split_k), config.block_k) * config.block_k
    target = (out.unsqueeze(0) if split_k == 1 else
              torch.empty((split_k, num_slices, num_tokens, max_rank), dtype=torch.float32, device=x.device))
    slices = lora_a + [lora_a[0]] * (MAX_SLICES - num_slices)
    block_n = _rank_block(max_rank)
    ranks, stride_r_slice = _ranks_table(slice_ranks, meta, num_slices, num_slots)
    tables = (meta.tile_segments, meta.tile_row_starts, meta.sorted_token_ids, meta.segment_starts,
              meta.segment_lens, meta.active_slots, ranks, stride_r_slice)
    _sgmv_shrink_kernel[(num_tiles * split_k, num_slices)](
        x, *slices, target, *tables,
        in_features, k_per_split, split_k,
        x.stride(0), x.stride(1),
        *lora_a[0].stride(),
        *target.stride(),
        BLOCK_M=meta.tile_rows, BLOCK_N=block_n, BLOCK_K=config.block_k, **_launch_options(config),
    )
    if split_k > 1:
        _sgmv_shrink_reduce_kernel[(num_tiles, num_slices)](
            target, out, *tables,
            split_k,
            target.stride(0), target.stride(1), target.stride(2),
            out.stride(0), out.stride(1),
            BLOCK_M=meta.tile_rows, BLOCK_N=block_n,
        )


def sgmv_expand(
    y: torch.Tensor,  # [num_slices, T, max_rank] from sgmv_shrink
    lora_b: list[torch.Tensor],  # per slice: [S, out_features_i, max_rank], lora scaling folded in
    meta: SGMVMetadata,
    base_out: torch.Tensor,  # [T, sum(out_features_i)], updated in place
    slice_offsets: list[int],  # [num_slices + 1] column offsets of each slice in base_out
    slice_ranks: torch.Tensor | None = None,  # [num_slices, S] int32; None: every slice has the slot's rank
    *,
    config: ExpandConfig = DEFAULT_EXPAND,
) -> None:
    """LoRA up-projection added into the base layer's output, all slices in one launch.

    for each segment a (slot s), token t in it, slice i with rank r (slice_ranks[i, s]) > 0:
        base_out[t, off_i:off_{i+1}] += y[i, t, :r] @ lora_b[i][s, :, :r].T
    K is the rank (at most a few dozen), so there is no K split: one program owns one
    BLOCK_M x BLOCK_N tile of base_out and adds into it without atomics.
    """
    num_slices, num_tokens, max_rank = y.shape
    _check_slices("lora_b", lora_b, y)
    assert len(lora_b) == num_slices, f"y has {num_slices} slices, lora_b has {len(lora_b)}"
    assert y.is_contiguous(), "y must be contiguous"
    assert len(slice_offsets) == num_slices + 1, (
        f"slice_offsets must have num_slices + 1 = {num_slices + 1} entries, got {len(slice_offsets)}")
    out_features = [b.shape[1] for b in lora_b]
    for i, b in enumerate(lora_b):
        assert b.shape[2] == max_rank, f"lora_b[{i}] has max_rank {b.shape[2]}, y has {max_rank}"
        assert slice_offsets[i + 1] - slice_offsets[i] == out_features[i], (
            f"slice_offsets[{i}:{i + 2}] spans {slice_offsets[i + 1] - slice_offsets[i]} columns but "
            f"lora_b[{i}] has {out_features[i]} output features")
    assert base_out.dim() == 2 and base_out.shape[0] == num_tokens and base_out.shape[1] >= slice_offsets[-1], (
        f"base_out must be [T={num_tokens}, >= {slice_offsets[-1]} columns]; got {tuple(base_out.shape)}")
    assert base_out.stride(1) == 1 and base_out.device == y.device, (
        "base_out must have contiguous rows and live on y's device")
    _check_metadata(meta, y.device, lora_b[0].shape[0])
    num_tiles = meta.tile_segments.shape[0]
    if num_tiles == 0:
        return  # no tile capacity (a base-only step): base_out stays as the base layer wrote it

    n_tiles = triton.cdiv(max(out_features), config.block_n)
    padding = MAX_SLICES - num_slices
    ranks, stride_r_slice = _ranks_table(slice_ranks, meta, num_slices, lora_b[0].shape[0])
    _sgmv_expand_kernel[(num_tiles * n_tiles, num_slices)](
        y, *(lora_b + [lora_b[0]] * padding), base_out,
        *(out_features + [0] * padding),
        *(slice_offsets[:num_slices] + [0] * padding),
        meta.tile_segments, meta.tile_row_starts, meta.sorted_token_ids, meta.segment_starts,
        meta.segment_lens, meta.active_slots, ranks, stride_r_slice,
        max_rank, n_tiles,
        y.stride(0), y.stride(1),
        base_out.stride(0),
        BLOCK_M=meta.tile_rows, BLOCK_N=config.block_n, BLOCK_K=_rank_block(max_rank), **_launch_options(config),
    )


def add_lora(
    x: torch.Tensor,  # [T, in_features]
    stack: SliceStack,  # per slice A [S, R, in], B [S, out_i, R] (lora scaling folded in), ranks [slices, S]
    meta: SGMVMetadata,
    out: torch.Tensor,  # [T, sum(out_features_i)]: the base layer's output, updated in place
    slice_offsets: list[int],  # [num_slices + 1]
) -> None:
    """kernels/reference.py add_lora's contract: shrink into a zeroed [num_slices, T, max_rank]
    buffer, then expand into out; slices an adapter does not target launch programs that exit at once."""
    lora_a = stack.lora_a
    # Zeroed, not empty: a kernel may read the rank padding, and 0 * NaN would poison the sum.
    shrunk = torch.zeros(len(lora_a), x.shape[0], lora_a[0].shape[1], dtype=lora_a[0].dtype, device=x.device)
    sgmv_shrink(x, lora_a, meta, shrunk, stack.ranks.device)
    sgmv_expand(shrunk, stack.lora_b, meta, out, slice_offsets, stack.ranks.device)
