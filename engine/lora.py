"""LoRA on the device: the adapter slot pool, the LoRA-wrapped linear, and the per-step SGMV metadata.

Which adapter key sits in which slot is decided by the scheduler's slot table;
the pool only copies validated weights (engine/lora_weights.py) into a given
slot index. Every slot has room for every targetable module at the server's max
rank, so one batched LoRA call per wrapped linear serves all adapters of a step,
and the Llama forward (engine/model.py) stays LoRA-free. Beside the weights the
pool keeps each slot's rank per module (SliceRanks, 0 where the adapter does not
target the module), so the kernels compute each adapter at its own rank on its
own modules only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from loraloom.engine.config import ModelConfig
from loraloom.engine.layers import Linear
from loraloom.engine.lora_weights import AdapterLoadError, AdapterWeights, load_adapter_weights, lora_module_shapes
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend
from loraloom.kernels.metadata import SGMVMetadata, SliceRanks
from loraloom.kernels.sgmv_plan import SGMVLayout, SGMVPlan, metadata_views, plan_sgmv, segment_capacity, tile_capacity

__all__ = [
    "AdapterLoadError",
    "AdapterWeights",
    "LoRALinear",
    "LoRASlotPool",
    "PACKED_MODULES",
    "SGMVLayout",
    "SGMVPlan",
    "attach_lora",
    "build_sgmv_metadata",
    "load_adapter_weights",
    "metadata_views",
    "plan_sgmv",
    "segment_capacity",
    "tile_capacity",
]

# Each wrapped Linear of a decoder layer -> the PEFT modules packed into its output, in slice order.
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "self_attn.o_proj": ("o_proj",),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.down_proj": ("down_proj",),
}
# Each PEFT module -> the wrapped Linear it is packed into, and its slice index there.
_PACKED_PATH = {module: path for path, modules in PACKED_MODULES.items() for module in modules}
_SLICE_INDEX = {module: modules.index(module) for modules in PACKED_MODULES.values() for module in modules}


class LoRASlotPool:
    """Preallocated per-slot LoRA stacks: for each layer and module, lora_a [S, R, in] and lora_b [S, out, R]."""

    def __init__(
        self,
        model_config: ModelConfig,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1 or max_rank < 1:
            raise ValueError(f"lora pool: num_slots ({num_slots}) and max_rank ({max_rank}) must be >= 1; "
                             "set EngineConfig.max_loras and max_lora_rank")
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.num_layers = model_config.num_layers
        shapes = lora_module_shapes(model_config)
        # Zero rank padding and untargeted modules contribute exactly nothing, so they need no masking.
        self.lora_a: list[dict[str, torch.Tensor]] = [
            {name: torch.zeros(num_slots, max_rank, shape.in_features, dtype=dtype, device=device)
             for name, shape in shapes.items()}
            for _ in range(self.num_layers)
        ]
        self.lora_b: list[dict[str, torch.Tensor]] = [
            {name: torch.zeros(num_slots, shape.out_features, max_rank, dtype=dtype, device=device)
             for name, shape in shapes.items()}
            for _ in range(self.num_layers)
        ]
        self.slot_ranks_host: list[int] = [0] * num_slots  # 0 = empty slot
        # Per layer and wrapped linear: each slot's rank in each of its slices (modules).
        self.slice_ranks: list[dict[str, SliceRanks]] = [
            {path: SliceRanks(device=torch.zeros(len(modules), num_slots, dtype=torch.int32, device=device),
                              host=[[0] * num_slots for _ in modules])
             for path, modules in PACKED_MODULES.items()}
            for _ in range(self.num_layers)
        ]

    def load(self, slot: int, weights: AdapterWeights) -> None:
        """Copy an adapter into `slot`, replacing whatever was there."""
        self._check_slot(slot)
        if weights.rank > self.max_rank:
            raise ValueError(f"lora pool: adapter rank {weights.rank} exceeds the pool's max_rank {self.max_rank}")
        self.clear(slot)
        for (layer, name), module in weights.modules.items():
            rank = module.lora_a.shape[0]
            self.lora_a[layer][name][slot, :rank].copy_(module.lora_a)  # [r, in]
            self.lora_b[layer][name][slot, :, :rank].copy_(module.lora_b)  # [out, r]
            self._set_module_rank(layer, name, slot, rank)
        self.slot_ranks_host[slot] = weights.rank

    def clear(self, slot: int) -> None:
        """Empty a slot: zero weights (a new adapter of lower rank leaves no stale columns) and rank 0 everywhere."""
        self._check_slot(slot)
        for stacks in (*self.lora_a, *self.lora_b):
            for stack in stacks.values():
                stack[slot].zero_()
        for layer_ranks in self.slice_ranks:
            for ranks in layer_ranks.values():
                ranks.device[:, slot] = 0
                for slice_ranks in ranks.host:
                    slice_ranks[slot] = 0
        self.slot_ranks_host[slot] = 0

    def _set_module_rank(self, layer: int, module: str, slot: int, rank: int) -> None:
        ranks, index = self.slice_ranks[layer][_PACKED_PATH[module]], _SLICE_INDEX[module]
        ranks.device[index, slot] = rank
        ranks.host[index][slot] = rank

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"lora pool: slot {slot} is out of range; the pool has {self.num_slots} slots")


class LoRALinear(nn.Module):
    """base(x) plus, for each token of an adapter slot, that slot's B @ A @ x per output slice."""

    def __init__(
        self,
        base: Linear,
        lora_a: list[torch.Tensor],  # per slice: [S, R, in] (views of the pool's stacks)
        lora_b: list[torch.Tensor],  # per slice: [S, out_slice, R]
        ranks: SliceRanks,  # each slot's rank per slice, kept current by the pool
        backend: KernelBackend,
    ) -> None:
        super().__init__()
        if len(lora_a) != len(base.slice_sizes) or len(lora_b) != len(base.slice_sizes):
            raise ValueError(f"LoRALinear: got {len(lora_a)} lora_a / {len(lora_b)} lora_b stacks for a Linear "
                             f"with slices {base.slice_sizes}; pass one per slice")
        for index, (a, b, size) in enumerate(zip(lora_a, lora_b, base.slice_sizes)):
            if a.shape[2] != base.in_features or b.shape[1] != size:
                raise ValueError(f"LoRALinear: slice {index} stacks have shapes {list(a.shape)} / {list(b.shape)}, "
                                 f"expected [S, R, {base.in_features}] / [S, {size}, R]")
        self.base = base
        # Plain lists, not buffers: the pool owns these tensors and loads adapters into them in place.
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.ranks = ranks
        self.backend = backend
        offsets = [0]
        for size in base.slice_sizes:
            offsets.append(offsets[-1] + size)
        self.slice_offsets = offsets  # [num_slices + 1] column offsets in the output

    @property
    def slice_sizes(self) -> tuple[int, ...]:
        return self.base.slice_sizes

    def forward(self, x: torch.Tensor, lora: SGMVMetadata | None) -> torch.Tensor:  # [T, in] -> [T, out]
        out = self.base(x, None)  # [T, out]
        if lora is None or lora.num_segments == 0:
            return out  # a base-only step: no LoRA work at all
        self.backend.add_lora(x, self.lora_a, self.lora_b, self.ranks, lora, out, self.slice_offsets)
        return out


def attach_lora(model: nn.Module, pool: LoRASlotPool, backend: KernelBackend = REFERENCE_BACKEND) -> None:
    """Replace the four projections of every decoder layer by LoRALinear wrappers over the pool's stacks."""
    if len(model.layers) != pool.num_layers:
        raise ValueError(f"attach_lora: the model has {len(model.layers)} layers but the pool was built for "
                         f"{pool.num_layers}; build the pool from the model's ModelConfig")
    for index, layer in enumerate(model.layers):
        for path, modules in PACKED_MODULES.items():
            block_name, linear_name = path.split(".")
            block = getattr(layer, block_name)
            base = getattr(block, linear_name)
            if not isinstance(base, Linear):
                raise TypeError(f"attach_lora: layers[{index}].{path} is a {type(base).__name__}, not a base Linear; "
                                "attach LoRA once, to a freshly loaded model")
            wrapped = LoRALinear(
                base,
                [pool.lora_a[index][name] for name in modules],
                [pool.lora_b[index][name] for name in modules],
                pool.slice_ranks[index][path],
                backend,
            )
            setattr(block, linear_name, wrapped)


def build_sgmv_metadata(
    token_slots: Sequence[int] | np.ndarray,  # [T]: adapter slot of each flat-batch token, -1 = base
    slot_ranks: Sequence[int] | np.ndarray,  # [S]: rank of the adapter in each slot, 0 = empty
    device: torch.device | str,
) -> SGMVMetadata | None:
    """Group the step's tokens by slot (ascending slot, batch order within a slot); None if all are base.

    Exact sizes (no padding); kernels/sgmv_plan.py plans padded metadata for CUDA graphs.
    """
    plan = plan_sgmv(token_slots, slot_ranks)
    if plan.num_segments == 0:
        return None  # base-only step: LoRALinear skips the adapters entirely
    return plan.to_metadata(device)
