"""LoRA on the device: the adapter slot pool, the LoRA-wrapped linear, and the per-step SGMV metadata.

Which adapter key sits in which slot is decided by the scheduler's slot table;
the pool only copies validated weights (engine/lora/weights.py) into a given
slot index, in the layout the kernel backend wants (kernels/lora_stacks.py), built
once per load. Every slot has room for every targetable module at the server's max
rank, so one add_lora call per wrapped linear serves all adapters of a step, and
the Llama forward (engine/model/llama.py) stays LoRA-free. The stacks know each slot's
rank per module (0 where the adapter does not target it), so the kernels compute
each adapter at its own rank on its own modules only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.layers import Linear
from loraloom.engine.model.llama import PACKED_MODULES
from loraloom.engine.lora.weights import AdapterWeights, lora_module_shapes
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend
from loraloom.kernels.lora_stacks import LoRAStack
from loraloom.kernels.metadata import SGMVMetadata
from loraloom.kernels.sgmv_plan import plan_sgmv

class LoRASlotPool:
    """Adapter slots: per decoder layer and wrapped linear, one stack (kernels/lora_stacks.py) in
    the layout the kernel backend's add_lora wants, filled when an adapter is loaded into a slot."""

    def __init__(
        self,
        model_config: ModelConfig,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device | str,
        backend: KernelBackend = REFERENCE_BACKEND,
        narrow_exact_adapters: bool = False,
    ) -> None:
        """narrow_exact_adapters: a slot keeps an adapter in its exact dtype (AdapterWeights.exact_dtype) when
        that is narrower than `dtype` and the backend's stacks can (the CPU's); outputs stay exactly those of
        `dtype`, and a decode step reads half the bytes for the adapter. EngineConfig.lora_dtype "auto"."""
        if num_slots < 1 or max_rank < 1:
            raise ValueError(f"lora pool: num_slots ({num_slots}) and max_rank ({max_rank}) must be >= 1; "
                             "set EngineConfig.max_loras and max_lora_rank")
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.num_layers = model_config.num_layers
        self.backend = backend
        self.dtype = dtype
        self.narrow_exact_adapters = narrow_exact_adapters and backend.lora_stack.holds_narrower_slots
        shapes = lora_module_shapes(model_config)
        self.stacks: list[dict[str, LoRAStack]] = [
            {path: backend.lora_stack.allocate(num_slots, max_rank, shapes[modules[0]].in_features,
                                               [shapes[name].out_features for name in modules], dtype, device)
             for path, modules in PACKED_MODULES.items()}
            for _ in range(self.num_layers)
        ]
        self.slot_ranks_host: list[int] = [0] * num_slots  # 0 = empty slot

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor of every stack (for memory plans and tests)."""
        return [tensor for layer in self.stacks for stack in layer.values() for tensor in stack.tensors()]

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors())

    def load(self, slot: int, weights: AdapterWeights) -> None:
        """Copy an adapter into `slot`, replacing whatever was there (modules it does not target get rank 0)."""
        self._check_slot(slot)
        if weights.rank > self.max_rank:
            raise ValueError(f"lora pool: adapter rank {weights.rank} exceeds the pool's max_rank {self.max_rank}")
        storage = self.storage_dtype(weights)
        for layer, stacks in enumerate(self.stacks):
            for path, stack in stacks.items():
                slices = []
                for name in PACKED_MODULES[path]:
                    module = weights.modules.get((layer, name))
                    slices.append(None if module is None else (module.lora_a, module.lora_b))  # [r, in], [out, r]
                stack.load(slot, slices, storage)
        self.slot_ranks_host[slot] = weights.rank

    def storage_dtype(self, weights: AdapterWeights) -> torch.dtype:
        """The dtype a slot stores `weights` in."""
        if self.narrow_exact_adapters and weights.exact_dtype.itemsize < self.dtype.itemsize:
            return weights.exact_dtype
        return self.dtype

    def clear(self, slot: int) -> None:
        """Empty a slot: zero weights and rank 0 everywhere."""
        self._check_slot(slot)
        for stacks in self.stacks:
            for stack in stacks.values():
                stack.clear(slot)
        self.slot_ranks_host[slot] = 0

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"lora pool: slot {slot} is out of range; the pool has {self.num_slots} slots")


class LoRALinear(nn.Module):
    """base(x) plus, for each token of an adapter slot, that slot's B @ A @ x per output slice."""

    def __init__(self, base: Linear, stack: LoRAStack, backend: KernelBackend) -> None:
        super().__init__()
        self.base = base
        # Not a buffer: the pool owns the stack and loads adapters into it in place.
        self.stack = stack
        self.backend = backend
        offsets = [0]
        for size in base.slice_sizes:
            offsets.append(offsets[-1] + size)
        self.slice_offsets = offsets  # [num_slices + 1] column offsets in the output

    @property
    def slice_sizes(self) -> tuple[int, ...]:
        return self.base.slice_sizes

    def forward(self, x: torch.Tensor, lora: SGMVMetadata | None) -> torch.Tensor:  # [T, in] -> [T, out]
        if lora is None or lora.num_segments == 0:
            return self.base(x, None)  # a base-only step: no LoRA work at all
        if self.base.plain_weight:
            # One call: on the CPU the adapters' weights stream beside the base matmul (kernels/cpu_linear.py).
            return self.backend.linear_add_lora(x, self.base.weight, self.stack, lora, self.slice_offsets)
        # A scaled product (FP8) runs in the base's own kernel; the LoRA is added on top in the activation dtype.
        out = self.base(x, None)
        self.backend.add_lora(x, self.stack, lora, out, self.slice_offsets)
        return out


def attach_lora(model: nn.Module, pool: LoRASlotPool) -> None:
    """Replace the four projections of every decoder layer by LoRALinear wrappers over the pool's stacks."""
    if len(model.layers) != pool.num_layers:
        raise ValueError(f"attach_lora: the model has {len(model.layers)} layers but the pool was built for "
                         f"{pool.num_layers}; build the pool from the model's ModelConfig")
    for index, layer in enumerate(model.layers):
        for path in PACKED_MODULES:
            block_name, linear_name = path.split(".")
            block = getattr(layer, block_name)
            base = getattr(block, linear_name)
            if not isinstance(base, Linear):
                raise TypeError(f"attach_lora: layers[{index}].{path} is a {type(base).__name__}, not a base Linear; "
                                "attach LoRA once, to a freshly loaded model")
            setattr(block, linear_name, LoRALinear(base, pool.stacks[index][path], pool.backend))


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
