"""Backend selection: Triton kernels for CUDA when Triton imports, plain torch otherwise."""
from __future__ import annotations

import importlib
import sys

import pytest

from loraloom.kernels import (cpu_attention, fp8, fp8_gemm, fp8_quant, norm, packed_lora, paged_attention, reference,
                             rotary, sgmv)
from loraloom.kernels.backend import get_backend


def test_cpu_uses_the_references_and_the_compiled_ops() -> None:
    backend = get_backend("cpu")
    assert backend.name == "cpu"
    assert backend.paged_attention is cpu_attention.paged_attention
    assert backend.add_lora is packed_lora.add_lora
    assert backend.rms_norm is reference.rms_norm and backend.fused_add_rms_norm is reference.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is reference.rotary_write_kv_cache
    assert backend.fp8_linear is fp8.fp8_linear  # no Triton kernels: _scaled_mm or the reference


def test_cuda_uses_the_triton_kernels() -> None:
    backend = get_backend("cuda:0")  # selection only: nothing is launched, no GPU needed
    assert backend.name == "triton"
    assert backend.write_kv_cache is paged_attention.write_kv_cache
    assert backend.paged_attention is paged_attention.paged_attention
    assert backend.add_lora is sgmv.add_lora
    assert backend.rms_norm is norm.rms_norm and backend.fused_add_rms_norm is norm.fused_add_rms_norm
    assert backend.rotary_write_kv_cache is rotary.rotary_write_kv_cache
    assert backend.fp8_linear == fp8.TritonFp8Linear(
        linear_small_m=fp8_gemm.fp8_linear_small_m,
        quantize_per_token=fp8_quant.quantize_per_token_triton,
        two_term_rows=fp8_quant.two_term_rows_triton,
    )


def test_imports_and_falls_back_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.delitem(sys.modules, "loraloom.kernels.backend")
    backend_module = importlib.import_module("loraloom.kernels.backend")

    backend = backend_module.get_backend("cuda")

    assert backend.name == "cpu"
    assert backend.add_lora is packed_lora.add_lora and backend.paged_attention is cpu_attention.paged_attention
    assert backend.fp8_linear is fp8.fp8_linear
