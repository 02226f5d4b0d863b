"""How many KV cache blocks the engine gets: the memory plan made once at start.

On CUDA, when `EngineConfig.num_kv_blocks` is None, the plan is measured: with
the weights and the LoRA slots already on the device, one profiling step as
large as the scheduler can ever emit (max_num_batched_tokens tokens over
max_num_seqs requests, every token on an adapter, every request sampled) runs
through the real ModelRunner, and `torch.cuda.max_memory_allocated` gives its
activation peak. The KV cache then gets what is left of
`gpu_memory_utilization` x the device's total memory after the resident
tensors, that peak and the memory used outside torch's allocator (the CUDA
context, library workspaces, other processes).

Everywhere else, or when num_kv_blocks is set, the configured number is kept
(DEFAULT_NUM_KV_BLOCKS when None) and the plan only reports what it costs.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from loraloom.engine.block_rows import BlockRows
from loraloom.engine.config import DEFAULT_NUM_KV_BLOCKS, EngineConfig, ModelConfig
from loraloom.engine.model.kv_scales import kv_cache_torch_dtype
from loraloom.engine.lora.layers import LoRASlotPool
from loraloom.engine.lora.weights import AdapterWeights, LoRAModuleWeights, lora_module_shapes
from loraloom.engine.model_runner import ModelRunner, StepTimings
from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.sampler import SamplerOutput
from loraloom.engine.scheduler import ScheduledRequest, SchedulerOutput

logger = logging.getLogger(__name__)

GB = 1e9
# The profiling step samples like the costliest real request: temperature, top-k and top-p
# (a sort over the vocabulary) and the largest logprobs request.
_PROFILE_SAMPLING = SamplingParams(max_tokens=1, temperature=1.0, top_k=50, top_p=0.9, logprobs=20)
_PROFILE_SLOT = 0


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int  # the model's parameters and buffers
    lora_slots_bytes: int  # the preallocated adapter slots
    activation_peak_bytes: int | None  # measured by the profiling step; None where nothing was profiled
    non_torch_bytes: int | None  # device memory in use outside torch's allocator; None off CUDA
    kv_cache_bytes: int
    num_kv_blocks: int
    block_size: int
    kv_cache_dtype: torch.dtype  # the activation dtype, or float8_e4m3fn (half of bf16's bytes per token)

    @property
    def max_num_tokens(self) -> int:
        """Tokens the KV cache holds, over all requests."""
        return self.num_kv_blocks * self.block_size

    def describe(self) -> str:
        def gb(value: int | None) -> str:
            if value is None:
                return "not measured"
            return f"{value / GB:.2f} GB" if value >= GB else f"{value / 1e6:.1f} MB"

        return (
            f"memory plan: weights {gb(self.weights_bytes)}, LoRA slots {gb(self.lora_slots_bytes)}, "
            f"activation peak {gb(self.activation_peak_bytes)}, outside torch {gb(self.non_torch_bytes)}, "
            f"KV cache {gb(self.kv_cache_bytes)} in {str(self.kv_cache_dtype).removeprefix('torch.')} = "
            f"{self.num_kv_blocks} blocks of {self.block_size} tokens ({self.max_num_tokens} tokens)"
        )


def kv_block_bytes(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over all layers: K and V, [block_size, num_kv_heads, head_dim] each."""
    per_layer = 2 * block_size * model_config.num_kv_heads * model_config.head_dim * dtype.itemsize
    return per_layer * model_config.num_layers


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each storage counted once (tied weights)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in (*module.parameters(), *module.buffers())}
    return sum(storages.values())


def kv_blocks_for_budget(
    *,
    total_bytes: int,
    gpu_memory_utilization: float,
    resident_bytes: int,
    activation_peak_bytes: int,
    non_torch_bytes: int,
    block_bytes: int,
) -> int:
    """Whole KV blocks that fit in utilization x total beside everything else (may be <= 0)."""
    available = int(total_bytes * gpu_memory_utilization) - resident_bytes - activation_peak_bytes - non_torch_bytes
    return available // block_bytes


def plan_memory(
    model: nn.Module, model_config: ModelConfig, config: EngineConfig, lora_pool: LoRASlotPool
) -> MemoryPlan:
    """The KV cache size for `config`; profiles the device when num_kv_blocks is None on CUDA.

    Call after the weights are loaded and LoRA is attached, before the KV cache exists.
    """
    if not 0.0 < config.gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {config.gpu_memory_utilization!r}")
    kv_dtype = kv_cache_torch_dtype(config)
    block_bytes = kv_block_bytes(model_config, config.block_size, kv_dtype)
    device = torch.device(config.device)
    measured = config.num_kv_blocks is None and device.type == "cuda"
    activation_peak = non_torch = None
    if measured:
        activation_peak = profile_activation_peak(model, model_config, config, lora_pool)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
        num_blocks = kv_blocks_for_budget(
            total_bytes=total,
            gpu_memory_utilization=config.gpu_memory_utilization,
            resident_bytes=torch.cuda.memory_allocated(device),
            activation_peak_bytes=activation_peak,
            non_torch_bytes=non_torch,
            block_bytes=block_bytes,
        )
        if num_blocks < 1:
            raise ValueError(
                f"gpu_memory_utilization: {config.gpu_memory_utilization} of {total / GB:.1f} GB leaves no room for "
                f"the KV cache after the weights, the LoRA slots and a {activation_peak / GB:.2f} GB activation peak; "
                "raise gpu_memory_utilization, or lower max_loras, max_lora_rank or max_num_batched_tokens"
            )
    else:
        num_blocks = DEFAULT_NUM_KV_BLOCKS if config.num_kv_blocks is None else config.num_kv_blocks
    plan = MemoryPlan(
        weights_bytes=module_bytes(model),
        lora_slots_bytes=lora_pool.nbytes,
        activation_peak_bytes=activation_peak,
        non_torch_bytes=non_torch,
        kv_cache_bytes=num_blocks * block_bytes,
        num_kv_blocks=num_blocks,
        block_size=config.block_size,
        kv_cache_dtype=kv_dtype,
    )
    logger.info(plan.describe())
    return plan


def profile_activation_peak(
    model: nn.Module, model_config: ModelConfig, config: EngineConfig, lora_pool: LoRASlotPool
) -> int:
    """Bytes the largest possible step (run_profile_step) allocates on top of what is resident; CUDA only.

    The step's KV cache is allocated before the measurement starts, so it does not count as activations.
    """
    device = torch.device(config.device)
    baseline = 0

    def start_measuring() -> None:
        nonlocal baseline
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)

    run_profile_step(model, model_config, config, lora_pool, before_step=start_measuring)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline


def run_profile_step(
    model: nn.Module,
    model_config: ModelConfig,
    config: EngineConfig,
    lora_pool: LoRASlotPool,
    before_step: Callable[[], None] = lambda: None,
) -> SamplerOutput:
    """Run the largest step the scheduler can emit through a ModelRunner with a KV cache just big enough.

    The step: min(max_num_seqs, max_num_batched_tokens) requests sharing max_num_batched_tokens
    tokens, the first one a prefill of all the tokens the others leave, every token on a max-rank
    adapter of zeros (so LoRA runs and changes nothing), every request sampled. Slot 0 of the pool
    is empty again afterwards. `before_step` runs once everything but the step is allocated.
    """
    num_tokens = config.max_num_batched_tokens
    num_requests = min(config.max_num_seqs, num_tokens)
    lengths = [num_tokens - (num_requests - 1)] + [1] * (num_requests - 1)
    blocks_per_request = [-(-length // config.block_size) for length in lengths]
    profile_config = dataclasses.replace(config, num_kv_blocks=sum(blocks_per_request))
    runner = ModelRunner(model=model, model_config=model_config, config=profile_config, lora_pool=lora_pool)
    scheduled = []
    next_block = 0
    for index, (length, num_blocks) in enumerate(zip(lengths, blocks_per_request)):
        request = Request(f"memory-profile-{index}", [0] * length, _PROFILE_SAMPLING)
        request.block_ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        scheduled.append(ScheduledRequest(request, num_new_tokens=length, slot=_PROFILE_SLOT, sample=True))
    block_rows = BlockRows.of(item.request for item in scheduled)
    step = SchedulerOutput(scheduled=scheduled, adapter_loads=[], preempted_ids=[], num_batched_tokens=num_tokens,
                           block_table=block_rows.array)
    lora_pool.load(_PROFILE_SLOT, _zero_adapter(model_config, lora_pool.max_rank))
    try:
        before_step()
        return runner.execute(step, {}, StepTimings())[0]
    finally:
        lora_pool.clear(_PROFILE_SLOT)


def _zero_adapter(model_config: ModelConfig, rank: int) -> AdapterWeights:
    """An adapter of the pool's max rank that adds nothing: it only makes the profiling step run LoRA."""
    shape = lora_module_shapes(model_config)["q_proj"]
    module = LoRAModuleWeights(lora_a=torch.zeros(rank, shape.in_features),  # [r, in]
                               lora_b=torch.zeros(shape.out_features, rank))  # [out, r]
    return AdapterWeights(rank=rank, modules={(0, "q_proj"): module})
