"""The building blocks of the Llama forward: linear, embedding, RMSNorm, rotary angles.

Parameters are allocated uninitialized (`torch.empty`): every one of them is
overwritten by the loader, so random initialization would only cost time.
"""
from __future__ import annotations

import math
from typing import ClassVar, overload

import torch
import torch.nn.functional as F
from torch import nn

from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend
from loraloom.kernels.metadata import SGMVMetadata


class Linear(nn.Module):
    """y = x @ W.T, with W [out, in] the concatenation of `slice_sizes` output slices.

    Fused projections keep their parts apart by `slice_sizes`: (q, k, v) for
    qkv_proj, (intermediate, intermediate) for gate_up_proj, (out,) otherwise.
    The LoRA wrapper (engine/lora/layers.py) replaces these modules and uses the slices
    and `lora`; the base layer ignores `lora`. The product runs in the backend's linear.
    """

    # The weight is multiplied as it is (no scales): a LoRA backend may fuse the adapters into this
    # product (linear_add_lora). A subclass whose product needs more than the weight says False.
    plain_weight: ClassVar[bool] = True

    def __init__(self, in_features: int, slice_sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                 backend: KernelBackend = REFERENCE_BACKEND):
        super().__init__()
        self.backend = backend
        self.in_features = in_features
        self.slice_sizes = tuple(slice_sizes)
        self.out_features = sum(self.slice_sizes)
        self.weight = nn.Parameter(
            torch.empty(self.out_features, in_features, dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, x: torch.Tensor, lora: SGMVMetadata | None) -> torch.Tensor:
        return self.backend.linear(x, self.weight)  # [T, in] -> [T, out]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, slice_sizes={self.slice_sizes}"


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(num_embeddings, embedding_dim, dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [T] -> [T, hidden]


class RMSNorm(nn.Module):
    """weight * rmsnorm(x), by the backend's kernel (kernels/reference.py holds the numerics).

    Given the residual stream as well, it first adds x into it, in one fused launch on CUDA,
    and returns (normed, new residual): the model never adds the residual separately.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device | str,
                 backend: KernelBackend = REFERENCE_BACKEND):
        super().__init__()
        self.eps = eps
        self.backend = backend
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device), requires_grad=False)

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, x, residual=None):  # [T, hidden] (and [T, hidden]) -> [T, hidden] (normed, residual)
        if residual is None:
            return self.backend.rms_norm(x, self.weight, self.eps)
        return self.backend.fused_add_rms_norm(x, residual, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (the "rotate half" layout of Hugging Face Llama checkpoints).

    cos/sin are computed from the position ids of each step rather than read from a
    table sized for the longest context, so any position the config admits works.
    """

    def __init__(self, head_dim: int, rope_theta: float, rope_scaling: dict | None, device: torch.device | str):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
        inv_freq = 1.0 / (rope_theta ** exponents)  # [head_dim / 2]
        if rope_scaling is not None:
            inv_freq = _scale_inv_freq(inv_freq, rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, head_dim] in `dtype`.

        Applied with the backend's rotary_write_kv_cache (kernels/reference.py: apply_rotary)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, head_dim / 2], fp32 for large positions
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _scale_inv_freq(inv_freq: torch.Tensor, rope_scaling: dict) -> torch.Tensor:
    rope_type = rope_scaling.get("rope_type")
    if rope_type != "llama3":
        raise ValueError(
            f"model: config.json rope scaling type {rope_type!r} is not supported; "
            "only 'llama3' (Llama 3.1) scaling or plain RoPE ('default') is"
        )
    return _llama3_inv_freq(
        inv_freq,
        factor=float(rope_scaling["factor"]),
        low_freq_factor=float(rope_scaling["low_freq_factor"]),
        high_freq_factor=float(rope_scaling["high_freq_factor"]),
        original_max_positions=int(rope_scaling["original_max_position_embeddings"]),
    )


def _llama3_inv_freq(
    inv_freq: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_positions: int,
) -> torch.Tensor:
    """Llama 3.1 context extension: frequencies whose wavelength exceeds the original context
    / low_freq_factor are slowed by `factor`, those shorter than context / high_freq_factor are
    kept, and the band between is interpolated linearly in (context / wavelength)."""
    wavelength = 2 * math.pi / inv_freq
    ratio = original_max_positions / wavelength  # how many wavelengths fit in the original context
    blend = ((ratio - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
    # blend 0: long wavelengths, fully scaled; blend 1: short ones, unchanged.
    return (1 - blend) * inv_freq / factor + blend * inv_freq
