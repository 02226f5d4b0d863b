"""The Llama forward over a flat batch of tokens and a paged KV cache.

A step's batch is every scheduled request's new tokens concatenated ([T]);
`AttentionMetadata` says which rows belong to which request and where their
K/V go in the cache, so prefill, chunked prefill and decode are one code path.
LoRA and FP8 are not here: they replace the `Linear` modules by name
(`layers[i].self_attn.qkv_proj`, `.o_proj`, `layers[i].mlp.gate_up_proj`, `.down_proj`).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.layers import Embedding, Linear, RMSNorm, RotaryEmbedding
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend
from loraloom.kernels.kv_quant import is_fp8_cache
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [num_blocks, block_size, KVH, D]

# Each fused projection of a decoder layer (its path in LlamaDecoderLayer) -> the Hugging Face modules
# packed into its output, in slice order. Whatever replaces the projections by name (LoRA's wrappers,
# FP8's linears) and whatever reads a checkpoint's per-module tensors (FP8 scales) walks this table.
PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "self_attn.o_proj": ("o_proj",),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.down_proj": ("down_proj",),
}


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        self.backend = backend
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = Linear(config.hidden_size, (q_size, kv_size, kv_size), dtype, device, backend)
        self.o_proj = Linear(q_size, (config.hidden_size,), dtype, device, backend)
        # An FP8 KV cache stores K / k_scale and V / v_scale (kernels/kv_quant.py); set by
        # engine/model/kv_scales.py (checkpoint or calibration) and read by the kernels on the device.
        # Not in the state dict: a checkpoint without them loads as before.
        self.register_buffer("k_scale", torch.ones(1, dtype=torch.float32, device=device), persistent=False)
        self.register_buffer("v_scale", torch.ones(1, dtype=torch.float32, device=device), persistent=False)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        rotary: tuple[torch.Tensor, torch.Tensor],  # (cos, sin), each [T, D]
        kv_cache: KVCache,
        attn: AttentionMetadata,
        lora: SGMVMetadata | None,
    ) -> torch.Tensor:  # [T, hidden]
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden, lora).split(self.qkv_proj.slice_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D], a view into the qkv output
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        scales = (self.k_scale, self.v_scale) if is_fp8_cache(k_cache) else (None, None)
        # One launch: q rotated in place (the qkv output is this layer's own), k rotated into the
        # cache next to v.
        self.backend.rotary_write_kv_cache(q, k, v, *rotary, k_cache, v_cache, attn.slot_mapping, *scales)
        out = self.backend.paged_attention(q, k_cache, v_cache, attn, self.scale, *scales)  # [T, H, D]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim), lora)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, (inter, inter), dtype, device, backend)
        self.down_proj = Linear(inter, (config.hidden_size,), dtype, device, backend)

    def forward(self, hidden: torch.Tensor, lora: SGMVMetadata | None) -> torch.Tensor:  # [T, hidden]
        gate, up = self.gate_up_proj(hidden, lora).chunk(2, dim=-1)  # each [T, inter]
        return self.down_proj(F.silu(gate) * up, lora)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: KernelBackend, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device, backend)
        self.self_attn = LlamaAttention(config, backend, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device, backend)
        self.mlp = LlamaMLP(config, backend, dtype, device)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]: the previous layer's MLP output, or the embeddings for layer 0
        residual: torch.Tensor | None,  # [T, hidden]: the stream before that output was added; None for layer 0
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache,
        attn: AttentionMetadata,
        lora: SGMVMetadata | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (MLP output, residual stream before it), both [T, hidden]
        """norm -> attention -> add + norm -> MLP; the MLP's own residual add is left to the next
        layer's add + norm (or the final norm), so each add rides in a norm's launch."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rotary, kv_cache, attn, lora)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden, lora), residual


class LlamaModel(nn.Module):
    """Parameter names match engine/model/loader.py's fused checkpoint names."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        attention: KernelBackend = REFERENCE_BACKEND,
    ):
        super().__init__()
        self.config = config
        self.backend = attention  # the kernels every layer runs; engine/model/fp8.py gives them to its linears
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype, device)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, attention, dtype, device) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device, attention)
        # Tied checkpoints reuse the embedding matrix as the output projection.
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, (config.vocab_size,), dtype, device, attention)
        # True once engine/model/loader.py has set every layer's k_scale / v_scale from the checkpoint;
        # otherwise an FP8 KV cache calibrates them at start (engine/model/kv_scales.py).
        self.kv_scales_from_checkpoint = False

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one per layer
        attn: AttentionMetadata,
        lora: SGMVMetadata | None,
    ) -> torch.Tensor:  # [T, hidden], final norm applied
        if len(kv_caches) != len(self.layers):
            raise ValueError(
                f"model: got {len(kv_caches)} kv_caches for {len(self.layers)} layers; "
                "allocate them with allocate_kv_cache(config, ...)"
            )
        hidden = self.embed_tokens(input_ids)  # [T, hidden]
        rotary = self.rotary(positions, hidden.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, rotary, kv_cache, attn, lora)
        if residual is None:  # a model with no layers
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self.backend.linear(hidden, weight).float()


def allocate_kv_cache(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> list[KVCache]:
    """One (k_cache, v_cache) pair per layer, each [num_blocks, block_size, num_kv_heads, head_dim].

    `dtype` is the activation dtype, or float8_e4m3fn for an FP8 cache (engine/model/kv_scales.py).

    Zeroed, not empty: attention masks unwritten slots out of the softmax, but a NaN
    left in a V slot would still poison the weighted sum (0 * NaN = NaN).
    """
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(config.num_layers)
    ]
