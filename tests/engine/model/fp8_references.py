"""What the FP8 tests check against: e4m3 rounding computed in fp64 from the format's definition,
one-sequence attention metadata, and which Hugging Face modules each fused projection holds."""
from __future__ import annotations

import torch

from loraloom.kernels.dtypes import FP8_MAX, MIN_AMAX
from loraloom.kernels.metadata import AttentionMetadata


HALF_ULP = 2.0 ** -4  # e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of itself
SUBNORMAL_HALF_STEP = 2.0 ** -10  # below 2^-6 the grid step is 2^-9 (in units of the scale)


# ----------------------------------------------------------------------------- fp64 references


def e4m3_grid() -> torch.Tensor:
    """Every non-negative finite float8_e4m3fn value, ascending, from the format's definition
    (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; exponent 15 with mantissa 7 is NaN)."""
    values = [m / 8 * 2.0 ** -6 for m in range(8)]  # subnormals, exponent field 0
    values += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8) if (e, m) != (15, 7)]
    return torch.tensor(values, dtype=torch.float64)


GRID = e4m3_grid()


def e4m3_neighbours(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp64 values saturated to +-448 -> (nearest e4m3 value with ties to the even code, the other
    of the two e4m3 values around v, whether v is so near their midpoint that fp32 arithmetic
    upstream of the rounding may land on either side). The grid index of a non-negative value is
    its 7-bit code, so "even code" is "even index"."""
    magnitude = v.abs().clamp(max=FP8_MAX)
    upper = torch.searchsorted(GRID, magnitude).clamp(1, len(GRID) - 1)  # GRID[upper - 1] <= magnitude <= GRID[upper]
    lower = upper - 1
    below, above = magnitude - GRID[lower], GRID[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    nearest = torch.where(pick_upper, GRID[upper], GRID[lower]) * v.sign()
    other = torch.where(pick_upper, GRID[lower], GRID[upper]) * v.sign()
    near_tie = (above - below).abs() <= 2.0 ** -20 * magnitude
    return nearest, other, near_tie


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    return e4m3_neighbours(v)[0]


def fake_quantize_rows_fp64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, C] -> (the e4m3 values x / scale rounds to, scale [R, 1]), all in fp64."""
    x64 = x.double()
    scale = x64.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    return round_to_e4m3(x64 / scale), scale


def assert_equal_but_near_ties(values: torch.Tensor, exact_quotients: torch.Tensor) -> None:
    """e4m3 `values` equal the fp64 rounding of `exact_quotients`, except that within fp32 precision
    of a midpoint (the scale is an fp32 number) either neighbour is right."""
    nearest, other, near_tie = e4m3_neighbours(exact_quotients)
    values = values.double()
    assert torch.equal(values[~near_tie], nearest[~near_tie])
    assert ((values == nearest) | (values == other))[near_tie].all()


def rows_of_many_magnitudes(rows: int, cols: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random rows scaled over six decades, so one shared scale would push small rows into subnormals."""
    generator = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.empty(rows, 1).uniform_(-3, 3, generator=generator)
    return (torch.randn(rows, cols, generator=generator) * magnitudes).to(dtype)


def single_sequence_metadata(length: int, block_size: int) -> AttentionMetadata:
    """One sequence of `length` new tokens in blocks 0, 1, 2, ... (a fresh cache: nothing before it)."""
    blocks = -(-length // block_size)
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, length], dtype=torch.int32),
        seq_lens=torch.tensor([length], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(length),
        query_start_loc_host=[0, length],
        seq_lens_host=[length],
    )


PROJECTION_PARTS = {  # LlamaModel projection -> the Hugging Face modules fused into it, in order
    ("self_attn", "qkv_proj"): ("q_proj", "k_proj", "v_proj"),
    ("self_attn", "o_proj"): ("o_proj",),
    ("mlp", "gate_up_proj"): ("gate_proj", "up_proj"),
    ("mlp", "down_proj"): ("down_proj",),
}
