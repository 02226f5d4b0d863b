"""The engine on a CUDA device: Triton kernels selected, decode steps replayed from CUDA graphs.

Skipped without a GPU (CI has none); run on the GPU machine with
    python benchmarks/run_gpu_tests.py
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
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.model.random_model import random_model
from loraloom.kernels.backend import get_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpusuite.adapters import write_random_adapter  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SMALL = ModelConfig(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=32,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
    eos_token_ids=(7,),
)


def make_engine(enforce_eager: bool, dtype: str = "float32") -> LLMEngine:
    model = random_model(SMALL, getattr(torch, dtype), "cuda", 0, get_backend("cuda"))
    config = EngineConfig(num_kv_blocks=256, block_size=16, max_num_seqs=16, max_num_batched_tokens=256,
                          max_loras=3, max_lora_rank=16, dtype=dtype, device="cuda", enforce_eager=enforce_eager)
    return LLMEngine.from_model(model, config)


def test_engine_runs_the_triton_kernels_on_cuda():
    engine = make_engine(enforce_eager=True)
    assert engine.runner.model.layers[0].self_attn.backend.name == "triton"


def test_graph_replays_generate_what_eager_steps_generate():
    rng = np.random.default_rng(1)
    prompts = [rng.integers(10, SMALL.vocab_size, size=int(n)).tolist() for n in rng.integers(5, 60, 11)]
    limits = [int(n) for n in rng.integers(3, 24, 11)]
    eager = generate(make_engine(enforce_eager=True), prompts, limits)
    engine = make_engine(enforce_eager=False)
    graphs = engine.runner.decode_graphs
    assert graphs is not None and all(entry.graph is not None for entry in graphs._graphs.values())
    assert generate(engine, prompts, limits) == eager


def test_graph_replays_with_adapters_generate_what_eager_steps_generate(tmp_path):
    adapters = [
        AdapterHandle(key=f"a{i}", name=f"a{i}",
                      uri=write_random_adapter(tmp_path / f"a{i}", SMALL, rank, 7 + i, torch.float32, "cuda").as_uri())
        for i, rank in enumerate((4, 16, 8, 16))
    ]
    rng = np.random.default_rng(2)
    count = 13
    prompts = [rng.integers(10, SMALL.vocab_size, size=int(n)).tolist() for n in rng.integers(5, 60, count)]
    limits = [int(n) for n in rng.integers(3, 24, count)]
    assignment = [None if i % 4 == 3 else adapters[i % len(adapters)] for i in range(count)]
    eager = generate(make_engine(enforce_eager=True), prompts, limits, assignment)
    assert generate(make_engine(enforce_eager=False), prompts, limits, assignment) == eager
