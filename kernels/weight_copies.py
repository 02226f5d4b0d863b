"""Copies of a weight in another layout, made at first use and kept on the weight tensor itself.

The CPU linears read a base weight in layouts of their own (kernels/cpu_linear.py's panels, oneDNN's
blocked layout: kernels/onednn_linear.py). Each copy is stored with the weight's version counter and made
again after any in-place change to the weight, so a stale copy is never read. An inference tensor has no
version counter: callers keep such weights on torch's matmul (`can_keep_copies`).
"""
from __future__ import annotations

from typing import Callable

import torch


def can_keep_copies(weight: torch.Tensor) -> bool:
    """Whether a change to the weight can be seen (not an inference tensor)."""
    return not weight.is_inference()


def kept_copy(weight: torch.Tensor, name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """make(weight) as kept on the weight under `name`, remade when the weight has changed since."""
    attribute = f"_loraloom_{name}"
    kept = getattr(weight, attribute, None)
    if kept is None or kept[0] != weight._version:
        kept = (weight._version, make(weight.detach()))
        setattr(weight, attribute, kept)
    return kept[1]
