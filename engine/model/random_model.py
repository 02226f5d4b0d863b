"""A Llama model with seeded random weights, made directly on the device.

For benchmarks of shapes whose checkpoint is not at hand (the GPU box has no
Llama-3.1-8B download): the cost of a forward depends on the shapes, not on
the values. The same seed on the same device gives the same weights, so a
peer implementation can be handed exactly the weights the engine serves.
"""
from __future__ import annotations

import torch

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.llama import LlamaModel
from loraloom.kernels.backend import REFERENCE_BACKEND, KernelBackend

# Hugging Face's default initializer_range: keeps activations of a deep random model finite in bf16.
WEIGHT_STD = 0.02


@torch.no_grad()
def random_model(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    attention: KernelBackend = REFERENCE_BACKEND,
) -> LlamaModel:
    """A LlamaModel of `config`'s shape: matrices drawn from N(0, WEIGHT_STD^2), norm weights 1."""
    model = LlamaModel(config, dtype, device, attention)
    generator = torch.Generator(device=torch.device(device)).manual_seed(seed)
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            parameter.fill_(1.0)
        else:
            parameter.normal_(0.0, WEIGHT_STD, generator=generator)
    return model.eval()
