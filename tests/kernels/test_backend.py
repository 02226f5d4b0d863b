"""Backend selection: Triton kernels for CUDA when Triton imports, plain torch otherwise."""
from __future__ import annotations

import importlib
import sys

import pytest

from loraloom.kernels import norm, paged_attention, reference, rotary, sgmv
from loraloom.kernels.backend import get_backend


def test_cpu_uses_the_references() -> None:
    backend = get_backend("cpu")
    assert backend.name == "reference"
    assert backend.paged_attention is reference.paged_attention
    assert backend.add_lora is reference.add_lora
    assert backend.rms_norm is reference.rms_norm and backend.fused_add_rms_norm is reference.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is reference.rotary_write_kv_cache


def test_cuda_uses_the_triton_kernels() -> None:
    backend = get_backend("cuda:0")  # selection only: nothing is launched, no GPU needed
    assert backend.name == "triton"
    assert backend.write_kv_cache is paged_attention.write_kv_cache
    assert backend.paged_attention is paged_attention.paged_attention
    assert backend.add_lora is sgmv.add_lora
    assert backend.rms_norm is norm.rms_norm and backend.fused_add_rms_norm is norm.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is rotary.rotary_write_kv_cache


def test_imports_and_falls_back_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.delitem(sys.modules, "loraloom.kernels.backend")
    backend_module = importlib.import_module("loraloom.kernels.backend")

    backend = backend_module.get_backend("cuda")

    assert backend.name == "reference"
    assert backend.add_lora is reference.add_lora and backend.paged_attention is reference.paged_attention
