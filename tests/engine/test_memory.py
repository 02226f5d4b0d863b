"""KV cache planning (engine/memory.py): block arithmetic, the CPU plan, and the profiling step.

The CUDA measurement itself needs a GPU; here the profiling step it measures runs on the CPU
through the real ModelRunner, so its batch is known to be one the engine can execute.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.engine.config import DEFAULT_NUM_KV_BLOCKS, EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.layers import LoRASlotPool, attach_lora
from loraloom.engine.memory import kv_block_bytes, kv_blocks_for_budget, plan_memory, run_profile_step
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.engine.model.random_model import random_model

TINY = ModelConfig(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_block_bytes_is_what_the_cache_allocates_per_block(dtype: torch.dtype) -> None:
    caches = allocate_kv_cache(TINY, 3, 16, dtype, "cpu")
    allocated = sum(k.nbytes + v.nbytes for k, v in caches)
    assert kv_block_bytes(TINY, 16, dtype) * 3 == allocated


def test_kv_blocks_for_budget_leaves_room_for_everything_else() -> None:
    # 90% of 10_000 = 9_000; minus 3_000 resident, 1_000 activations, 500 outside torch = 4_500 -> 70 blocks of 64.
    blocks = kv_blocks_for_budget(total_bytes=10_000, gpu_memory_utilization=0.9, resident_bytes=3_000,
                                  activation_peak_bytes=1_000, non_torch_bytes=500, block_bytes=64)
    assert blocks == 70
    assert kv_blocks_for_budget(total_bytes=10_000, gpu_memory_utilization=0.5, resident_bytes=5_000,
                                activation_peak_bytes=1, non_torch_bytes=0, block_bytes=64) < 1


def tiny_engine(config: EngineConfig) -> tuple[LLMEngine, int]:
    """An engine over a random TINY model, and the model's parameter + buffer bytes counted beforehand."""
    model = random_model(TINY, torch.float32, "cpu", seed=0)
    tensors = [*model.parameters(), *model.buffers()]
    return LLMEngine.from_model(model, config), sum(t.numel() * t.element_size() for t in tensors)


def test_cpu_plan_defaults_to_the_configured_pool() -> None:
    engine, weight_bytes = tiny_engine(EngineConfig())
    plan = engine.memory_plan
    assert engine.config.num_kv_blocks == plan.num_kv_blocks == DEFAULT_NUM_KV_BLOCKS
    assert engine.runner.kv_caches[0][0].shape[0] == DEFAULT_NUM_KV_BLOCKS
    assert engine.block_manager.num_blocks == DEFAULT_NUM_KV_BLOCKS
    assert plan.kv_cache_bytes == DEFAULT_NUM_KV_BLOCKS * kv_block_bytes(TINY, 16, torch.float32)
    assert plan.weights_bytes == weight_bytes
    assert plan.activation_peak_bytes is None
    assert plan.max_num_tokens == DEFAULT_NUM_KV_BLOCKS * 16
    assert f"{DEFAULT_NUM_KV_BLOCKS} blocks" in plan.describe()


def test_an_explicit_block_count_is_kept() -> None:
    engine, _ = tiny_engine(EngineConfig(num_kv_blocks=40, block_size=8))
    assert engine.config.num_kv_blocks == engine.memory_plan.num_kv_blocks == 40
    assert engine.max_model_len == 40 * 8


def test_unplanned_config_has_no_max_model_len() -> None:
    with pytest.raises(ValueError, match="^num_kv_blocks: not planned yet"):
        EngineConfig().resolved_max_model_len(TINY)


@pytest.mark.parametrize("utilization", [0.0, 1.5])
def test_gpu_memory_utilization_is_validated(utilization: float) -> None:
    model = random_model(TINY, torch.float32, "cpu", seed=0)
    pool = LoRASlotPool(TINY, num_slots=1, max_rank=8, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="^gpu_memory_utilization: must be in"):
        plan_memory(model, TINY, EngineConfig(gpu_memory_utilization=utilization), pool)


@pytest.mark.parametrize("max_num_seqs, max_num_batched_tokens", [(8, 40), (64, 20), (1, 33)])
def test_profile_step_runs_the_largest_step_and_leaves_the_pool_empty(max_num_seqs, max_num_batched_tokens) -> None:
    model = random_model(TINY, torch.float32, "cpu", seed=0)
    pool = LoRASlotPool(TINY, num_slots=2, max_rank=8, dtype=torch.float32, device="cpu")
    attach_lora(model, pool)
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, block_size=4)
    calls = []
    sampled = run_profile_step(model, TINY, config, pool, before_step=lambda: calls.append(pool.slot_ranks_host[0]))
    assert calls == [8]  # called once, with the max-rank profiling adapter loaded in slot 0
    assert len(sampled.token_ids) == min(max_num_seqs, max_num_batched_tokens)
    assert pool.slot_ranks_host == [0, 0]
    assert all(not tensor.any() for tensor in pool.tensors())
