"""Whether an engine of the suite fits on the smallest GPU the machine is lent, worked out on paper.

The dry run (gpu_suite.py --dry-run, benchmarks/gpu_checklist.sh --dry-run) checks each engine the
selected scenarios build before any GPU time is spent: the weights as served, the LoRA slot pool and
the KV cache the scenario must hold at once. Activations, the CUDA context and the allocator's
slack are not counted; they must fit in what is left of gpu_memory_utilization, and the engine's
own memory plan measures them on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusuite.adapters import adapter_params
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.memory import GB, kv_block_bytes

# An H100 80GB, the smallest card lent (docs: "one H100 80GB, sometimes an H200 141GB").
SMALLEST_GPU_BYTES = 80 * 10**9


@dataclass(frozen=True)
class EngineSize:
    """What build_engine is given (scenarios.py)."""

    max_loras: int
    max_lora_rank: int
    max_num_seqs: int


@dataclass(frozen=True)
class Fit:
    weights_bytes: int
    lora_slots_bytes: int
    kv_bytes: int
    budget_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.lora_slots_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    def describe(self) -> str:
        return (f"weights {self.weights_bytes / GB:.1f} GB + LoRA slots {self.lora_slots_bytes / GB:.1f} GB + "
                f"KV {self.kv_bytes / GB:.1f} GB = {self.total_bytes / GB:.1f} GB of {self.budget_bytes / GB:.1f} GB")


def served_weight_bytes(config: ModelConfig, dtype: torch.dtype, quantized: bool) -> int:
    """The projections in one byte a weight under FP8 (else `dtype`), embeddings and lm_head in `dtype`."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    projections = (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter) * config.num_layers
    vocabulary = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return projections * (1 if quantized else dtype.itemsize) + vocabulary * dtype.itemsize


def engine_fit(config: ModelConfig, dtype: torch.dtype, quantized: bool, size: EngineSize,
               requests: int, tokens_each: int) -> Fit:
    """The engine's static memory with `requests` requests of `tokens_each` tokens of KV held at once
    (each in whole blocks), against gpu_memory_utilization of the smallest card."""
    engine_config = EngineConfig(max_loras=size.max_loras, max_lora_rank=size.max_lora_rank,
                                 max_num_seqs=size.max_num_seqs)  # its own checks of the sizes
    block = engine_config.block_size
    blocks = requests * -(-tokens_each // block)
    return Fit(
        weights_bytes=served_weight_bytes(config, dtype, quantized),
        lora_slots_bytes=size.max_loras * adapter_params(config, size.max_lora_rank) * dtype.itemsize,
        kv_bytes=blocks * kv_block_bytes(config, block, dtype),
        budget_bytes=int(SMALLEST_GPU_BYTES * engine_config.gpu_memory_utilization),
    )
