"""Adapter popularity mixes and SGMV metadata for the kernel tests.

A mix assigns each flat-batch token an adapter slot (-1 = base); `sgmv_metadata` groups the
tokens with the engine's own planner (tests/kernels/test_sgmv_plan.py checks it against an oracle),
exactly or padded to capacities like a CUDA-graph step.
"""
from __future__ import annotations

import torch

from loraloom.kernels.sgmv_plan import plan_sgmv
from loraloom.kernels.metadata import SGMVMetadata

# Ranks mixed in one batch; slot 5 stays empty (rank 0) and is never used.
SLOT_RANKS = [8, 64, 16, 8, 64, 0]
MAX_RANK = 64
LOADED_SLOTS = [slot for slot, rank in enumerate(SLOT_RANKS) if rank > 0]


def _decode_mix(num_tokens: int, weights: list[float], base_share: float, seed: int) -> list[int]:
    """One token per request, slots drawn by popularity weights, a share of base requests."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.multinomial(torch.tensor(weights), num_tokens, replacement=True, generator=generator)
    is_base = torch.rand(num_tokens, generator=generator) < base_share
    return [-1 if base else LOADED_SLOTS[int(slot)] for slot, base in zip(slots, is_base)]


def adapter_mix(name: str, num_tokens: int, seed: int) -> list[int]:
    """token -> slot for one of the named popularity mixes."""
    count = len(LOADED_SLOTS)
    if name == "all_distinct":
        # Every adapter token its own segment; the rest of the batch is base.
        return [LOADED_SLOTS[t] if t < count else -1 for t in range(num_tokens)]
    if name == "uniform":
        return _decode_mix(num_tokens, [1.0] * count, base_share=0.2, seed=seed)
    if name == "zipf":
        return _decode_mix(num_tokens, [1.0 / (k + 1) ** 1.1 for k in range(count)], base_share=0.1, seed=seed)
    if name == "one_adapter":
        return [LOADED_SLOTS[1]] * num_tokens
    if name == "all_base":
        return [-1] * num_tokens
    if name == "skewed":
        # A long prefill of one adapter (several row tiles, an odd tail) next to one-token
        # segments of every other adapter, in scrambled batch order.
        single = [LOADED_SLOTS[k] for k in range(1, count)]
        slots = single + [-1, -1] + [LOADED_SLOTS[0]] * (num_tokens - len(single) - 2)
        order = torch.randperm(num_tokens, generator=torch.Generator().manual_seed(seed))
        return [slots[i] for i in order]
    if name == "verify":
        # A speculative decoding step: each request its last token plus 0 to 6 proposed ones, all on its
        # adapter, sorted by slot as the scheduler sorts them (base first).
        generator = torch.Generator().manual_seed(seed)
        slots: list[int] = []
        while len(slots) < num_tokens:
            adapter = LOADED_SLOTS[int(torch.randint(count, (1,), generator=generator))]
            slot = -1 if torch.rand(1, generator=generator) < 0.2 else adapter
            slots += [slot] * (1 + int(torch.randint(7, (1,), generator=generator)))
        return sorted(slots[:num_tokens])
    raise ValueError(f"unknown adapter mix {name!r}")


MIXES = ["all_distinct", "uniform", "zipf", "one_adapter", "all_base", "skewed", "verify"]


def sgmv_metadata(token_slots: list[int], slot_ranks: list[int], *, extra_segments: int = 0,
                  extra_tiles: int = 0, tile_rows: int = 16) -> SGMVMetadata:
    """Metadata on the CPU (also for an all-base step), with optional padding segments and tiles."""
    exact = plan_sgmv(token_slots, slot_ranks, tile_rows=tile_rows)
    if not extra_segments and not extra_tiles:
        return exact.to_metadata("cpu")
    return plan_sgmv(token_slots, slot_ranks, tile_rows=tile_rows, max_segments=exact.num_segments + extra_segments,
                     max_tiles=exact.num_tiles + extra_tiles).to_metadata("cpu")
