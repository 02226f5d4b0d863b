"""The model shapes and the scenario sizes of the two modes: the GPU run and the CPU run CI executes."""
from __future__ import annotations

from dataclasses import dataclass

from loraloom.engine.config import ModelConfig

# Llama-3.1-8B(-Instruct) config.json: the production target (docs/ARCHITECTURE.md).
LLAMA_3_1_8B = ModelConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    bos_token_id=128000,
    eos_token_ids=(128001, 128008, 128009),
)

# The shape of the bundled SmolLM2-135M-Instruct, the model CI serves on CPU.
SMOLLM2_135M = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_ids=(2,),
)


@dataclass(frozen=True)
class Sizes:
    """Every size a scenario uses; the issue's numbers are the GPU ones."""

    context: int  # batch-1 decode context and the time-to-first-token prompt
    decode_steps: int  # decode steps timed per throughput measurement
    concurrency: tuple[int, ...]  # concurrent decoding requests
    concurrent_prompt: int  # prompt tokens of each concurrent request
    num_adapters: int  # distinct adapters in the multi-adapter scenarios (and GPU slots there)
    mixed_ranks: tuple[int, ...]  # the ranks cycled through in the mixed-rank scenario
    offline_prompt: int
    offline_output: int
    offline_max_requests: int  # the offline scenario runs the most concurrent requests that fit, up to this
    ttft_repeats: int
    cold_load_background: int  # requests decoding while an adapter loads
    zipf_adapters: int
    zipf_slots: int
    zipf_requests: int
    zipf_prompt: int
    zipf_output: int
    zipf_weight_files: int  # distinct weight files behind the Zipf adapters (each adapter its own key)
    peer_decode_steps: int
    kernel_batch: int  # decode requests in the kernel checks
    kernel_context: int  # their context
    max_num_batched_tokens: int
    copy_bytes: int  # tensor size of the bandwidth measurement
    matmul_size: int  # n of the n x n x n matrix-rate measurement


GPU_SIZES = Sizes(
    context=1024,
    decode_steps=64,
    concurrency=(64, 256),
    concurrent_prompt=512,
    num_adapters=64,
    mixed_ranks=(8, 16, 32, 64),
    offline_prompt=1000,
    offline_output=1000,
    offline_max_requests=1024,
    ttft_repeats=5,
    cold_load_background=32,
    zipf_adapters=1000,
    zipf_slots=32,
    zipf_requests=512,
    zipf_prompt=256,
    zipf_output=128,
    zipf_weight_files=16,
    peer_decode_steps=16,
    kernel_batch=64,
    kernel_context=1024,
    max_num_batched_tokens=2048,
    copy_bytes=1 << 30,
    matmul_size=8192,
)

CPU_SMALL_SIZES = Sizes(
    context=64,
    decode_steps=4,
    concurrency=(4, 8),
    concurrent_prompt=16,
    num_adapters=4,
    mixed_ranks=(8, 16, 32, 64),
    offline_prompt=24,
    offline_output=8,
    offline_max_requests=8,
    ttft_repeats=2,
    cold_load_background=4,
    zipf_adapters=40,
    zipf_slots=4,
    zipf_requests=12,
    zipf_prompt=8,
    zipf_output=4,
    zipf_weight_files=2,
    peer_decode_steps=4,
    kernel_batch=4,
    kernel_context=64,
    max_num_batched_tokens=256,
    copy_bytes=1 << 26,
    matmul_size=512,
)
