"""Backend selection: Triton kernels for CUDA when Triton imports, plain torch otherwise."""
from __future__ import annotations

import importlib
import sys

import pytest

from loraloom.kernels import cpu_lora, norm, paged_attention, reference, rotary, sgmv
from loraloom.kernels.backend import get_backend


def test_cpu_uses_the_references_and_the_dense_sgmv() -> None:
    backend = get_backend("cpu")
    assert backend.name == "torch"
    assert backend.paged_attention is reference.paged_attention
    assert backend.sgmv_shrink is cpu_lora.sgmv_shrink and backend.sgmv_expand is cpu_lora.sgmv_expand
    assert backend.rms_norm is reference.rms_norm and backend.fused_add_rms_norm is reference.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is reference.rotary_write_kv_cache


def test_cuda_uses_the_triton_kernels() -> None:
    backend = get_backend("cuda:0")  # selection only: nothing is launched, no GPU needed
    assert backend.name == "triton"
    assert backend.write_kv_cache is paged_attention.write_kv_cache
    assert backend.paged_attention is paged_attention.paged_attention
    assert backend.sgmv_shrink is sgmv.sgmv_shrink
    assert backend.sgmv_expand is sgmv.sgmv_expand
    assert backend.rms_norm is norm.rms_norm and backend.fused_add_rms_norm is norm.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is rotary.rotary_write_kv_cache


def test_imports_and_falls_back_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.delitem(sys.modules, "loraloom.kernels.backend")
    backend_module = importlib.import_module("loraloom.kernels.backend")

    backend = backend_module.get_backend("cuda")

    assert backend.name == "torch"
    assert backend.sgmv_expand is cpu_lora.sgmv_expand and backend.paged_attention is reference.paged_attention
