"""engine/cuda_graphs.py on the CPU: decode steps through the static, padded buffers of the graph path.

Without a GPU nothing is captured (capture=False), but every step that would replay a graph runs
the same forward pass on the same static buffers with the same padding rows, so the tokens must
equal a plain eager engine's. The capture itself is checked on a GPU (tests/engine/test_cuda.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from greedy_runs import generate
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.cuda_graphs import CAPTURE_SIZES, DecodeGraphs, capture_sizes
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.model.random_model import random_model
from loraloom.engine.request import SamplingParams
from loraloom.kernels.backend import REFERENCE_BACKEND

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpusuite.adapters import write_random_adapter  # noqa: E402

TINY = ModelConfig(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
    eos_token_ids=(7,),
)


def make_engine(max_num_seqs: int, graphs: bool, max_loras: int = 2) -> LLMEngine:
    model = random_model(TINY, torch.float32, "cpu", 0, REFERENCE_BACKEND)
    engine = LLMEngine.from_model(model, EngineConfig(num_kv_blocks=128, block_size=4, max_num_seqs=max_num_seqs,
                                                      max_num_batched_tokens=32, max_loras=max_loras,
                                                      max_lora_rank=8))
    if graphs:
        engine.runner.enable_decode_graphs(engine.max_model_len, capture=False)
    return engine


def test_capture_sizes_cover_every_batch():
    assert capture_sizes(256) == list(CAPTURE_SIZES)
    assert capture_sizes(5) == [1, 2, 4, 5]
    assert capture_sizes(300)[-1] == 300


def test_padded_decode_steps_generate_what_eager_steps_generate():
    rng = np.random.default_rng(0)
    # 7 requests of different lengths finishing at different times: the decode batch shrinks
    # through sizes 7, 6, ... 1, each padded up to a captured size (8, 8, 4, 4, 4, 2, 1).
    prompts = [rng.integers(10, TINY.vocab_size, size=int(length)).tolist() for length in rng.integers(3, 20, 7)]
    limits = [int(limit) for limit in rng.integers(2, 14, 7)]
    eager = generate(make_engine(8, graphs=False), prompts, limits)
    engine = make_engine(8, graphs=True)
    replays = []
    original_run = engine.runner.decode_graphs.stage

    def counting_run(batch):
        replays.append(batch.num_seqs)
        return original_run(batch)

    engine.runner.decode_graphs.stage = counting_run
    assert generate(engine, prompts, limits) == eager
    assert len(set(replays)) >= 4, f"the graph path ran for batch sizes {sorted(set(replays))} only"
    assert engine.block_manager.num_used_blocks == 0


def test_padding_rows_write_nothing_into_the_kv_cache():
    engine = make_engine(8, graphs=True)
    graphs: DecodeGraphs = engine.runner.decode_graphs
    for index in range(3):  # a decode batch of 3 replays the size-4 graph: one padding row
        engine.add_request(f"r{index}", [11 + index, 12, 13], SamplingParams(max_tokens=3, temperature=0.0,
                                                                             ignore_eos=True))
    engine.step()  # the three prefills, eager
    before = [cache.clone() for pair in engine.runner.kv_caches for cache in pair]
    sizes = []
    original_run = graphs.stage
    graphs.stage = lambda batch: sizes.append(batch.num_seqs) or original_run(batch)
    engine.step()
    assert sizes == [3] and next(size for size in graphs.sizes if size >= 3) == 4
    after = [cache for pair in engine.runner.kv_caches for cache in pair]
    changed_slots = [int((a != b).any(dim=-1).any(dim=-1).sum()) for a, b in zip(after, before)]
    assert changed_slots == [3] * (2 * TINY.num_layers)  # the three real tokens' slots, in K and V of each layer


def test_padded_decode_steps_with_adapters_generate_what_eager_steps_generate(tmp_path):
    adapters = [
        AdapterHandle(key=f"a{i}", name=f"a{i}",
                      uri=write_random_adapter(tmp_path / f"a{i}", TINY, rank, 40 + i, torch.float32, "cpu").as_uri())
        for i, rank in enumerate((4, 8, 8, 2))
    ]
    rng = np.random.default_rng(3)
    count = 11
    prompts = [rng.integers(10, TINY.vocab_size, size=int(n)).tolist() for n in rng.integers(3, 16, count)]
    limits = [int(n) for n in rng.integers(2, 12, count)]
    # Base rows mixed with four adapters over three slots: segments of different lengths and ranks.
    assignment = [None if i % 4 == 3 else adapters[i % len(adapters)] for i in range(count)]
    eager = generate(make_engine(16, graphs=False, max_loras=3), prompts, limits, assignment)
    engine = make_engine(16, graphs=True, max_loras=3)
    graphs: DecodeGraphs = engine.runner.decode_graphs
    with_adapters = []
    original_run = graphs.stage
    graphs.stage = lambda batch: with_adapters.append(batch.uses_adapters) or original_run(batch)
    assert generate(engine, prompts, limits, assignment) == eager
    assert any(with_adapters), "no decode step with adapters went through the graph path"
    # The adapters changed what was generated: the comparison above is not base against base.
    assert generate(make_engine(16, graphs=False, max_loras=3), prompts, limits) != eager
