"""float32 x @ W.T through oneDNN on a copy of W reordered for it once: the CPU backend's base matmul for
inputs past the compiled panel matmul's rows (prefills; kernels/cpu_linear.py), and for every input of
MIN_ROWS rows and more where the compiled ops did not build.

Why: torch's matmul calls MKL, and MKL runs its AVX2 kernels on AMD CPUs even where the CPU has AVX-512
(`perf` of a 32-row decode matmul on a 2-core AMD EPYC, Zen 5: 86% in `mkl_blas_def_sgemm_kernel_0_zen`, on
ymm registers). oneDNN chooses its kernels by the CPU's instruction sets, and on a weight reordered into
its own blocked layout it ran the bundled model's shapes 2.0-3.2x faster than MKL on one thread at 8 to 128
rows (benchmarks/cpu_gemm_probe.py), and 1.4-2.9x on two threads at 129 and 512 rows (on a busy machine).

Below MIN_ROWS the matmul is bound by reading the weights, and oneDNN's fixed cost per call (~10 us,
measured) is larger than MKL's.

The reordered copy is kept on the weight (kernels/weight_copies.py); the weight itself stays, for the
other paths. LORALOOM_CPU_ONEDNN=0 turns this path off (to compare).
"""
from __future__ import annotations

import functools
import logging
import os

import torch

from loraloom.kernels import weight_copies

log = logging.getLogger(__name__)

DISABLE_ENV = "LORALOOM_CPU_ONEDNN"
# Inputs of at least this many rows take oneDNN (read at each call, so tests may move it).
MIN_ROWS = 8
# The row count oneDNN's weight layout is chosen for. One layout serves every row count: on a 2-core EPYC,
# a layout chosen for 32 rows ran 8 to 128 rows within ~10% of one chosen for their own count.
LAYOUT_ROWS = 32


@functools.cache
def available() -> bool:
    """oneDNN is in this torch build, not turned off, and computes a small product right (checked once)."""
    if os.environ.get(DISABLE_ENV, "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        product = torch.ops.mkldnn._linear_pointwise(torch.tensor([[1.0, 1.0]]), _reorder(weight), None, "none",
                                                     [], "")
        return torch.equal(product, torch.tensor([[3.0, 7.0]]))
    except (AttributeError, RuntimeError) as error:  # an op missing from this build, or refused on this CPU
        log.warning("oneDNN linear unavailable, the CPU linears keep torch's matmul: %s", error)
        return False


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether matmul takes these operands: 2-D float32 CPU tensors, x of at least MIN_ROWS rows, and a weight
    with a version counter (not an inference tensor: a change to one could not be seen, so it keeps MKL)."""
    return (x.dim() == 2 and weight.dim() == 2 and x.shape[0] >= MIN_ROWS and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.device.type == "cpu" and weight.device.type == "cpu"
            and weight_copies.can_keep_copies(weight) and available())


def matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [T, in] x [out, in] -> [T, out]
    """x @ weight.T by oneDNN; only for operands that `applies` accepts."""
    reordered = weight_copies.kept_copy(weight, "onednn_weight", _reorder)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), reordered, None, "none", [], "")


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), LAYOUT_ROWS)
