"""The model's fused add + norm wiring computes exactly what the unfused Llama layer does.

Each layer used to be `h = h + attn(norm1(h)); h = h + mlp(norm2(h))` and the model ended in
`norm(h)`; now the adds ride in the norms (RMSNorm given a residual). On the reference backend
both must give the same bits, in bf16 as in fp32, or the CPU path's numerics have changed.
"""
from __future__ import annotations

import pytest
import torch

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.llama import allocate_kv_cache
from loraloom.engine.model.random_model import random_model
from loraloom.kernels.metadata import AttentionMetadata

TINY = ModelConfig(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
)
BLOCK_SIZE = 16


def prefill_metadata(lengths: list[int]) -> AttentionMetadata:
    """Fresh prompts, each in its own consecutive blocks."""
    starts, slots, tables, next_block = [0], [], [], 0
    for length in lengths:
        blocks = list(range(next_block, next_block + -(-length // BLOCK_SIZE)))
        next_block += len(blocks)
        tables.append(blocks)
        slots += [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(length)]
        starts.append(starts[-1] + length)
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc_host=starts,
        seq_lens_host=lengths,
    )


def unfused_forward(model, input_ids, positions, kv_caches, attn) -> torch.Tensor:
    """The layer as written before the fusion, from the same modules."""
    hidden = model.embed_tokens(input_ids)
    rotary = model.rotary(positions, hidden.dtype)
    for layer, kv_cache in zip(model.layers, kv_caches):
        hidden = hidden + layer.self_attn(layer.input_layernorm(hidden), rotary, kv_cache, attn, None)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden), None)
    return model.norm(hidden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_fused_residual_wiring_is_bit_identical(dtype: torch.dtype) -> None:
    model = random_model(TINY, dtype, "cpu", seed=3)
    for name, parameter in model.named_parameters():  # norm weights other than 1 exercise the multiply
        if name.endswith("norm.weight"):
            parameter.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    lengths = [5, 19]
    attn = prefill_metadata(lengths)
    input_ids = torch.randint(0, TINY.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in lengths])

    fused = model(input_ids, positions, allocate_kv_cache(TINY, 4, BLOCK_SIZE, dtype, "cpu"), attn, None)
    unfused = unfused_forward(model, input_ids, positions, allocate_kv_cache(TINY, 4, BLOCK_SIZE, dtype, "cpu"), attn)

    assert torch.equal(fused, unfused)
