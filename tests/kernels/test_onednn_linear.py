"""kernels/onednn_linear.py: oneDNN's matmul on a reordered copy of the weight, against the float64 product;
which operands it takes; and the switch that turns it off. That the copy follows in-place changes to the
weight: test_weight_copies.py."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import onednn_linear


@pytest.fixture(autouse=True)
def onednn() -> None:
    assert onednn_linear.available(), "oneDNN's linear is unavailable in this torch build"


def float64_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.double() @ weight.double().t()


@pytest.mark.parametrize("rows", [onednn_linear.MIN_ROWS, 32, 129])
@pytest.mark.parametrize("out_features", [24, 200, 1100])
def test_matmul_matches_the_float64_product(rows: int, out_features: int) -> None:
    generator = torch.Generator().manual_seed(rows + out_features)
    x = torch.randn(rows, 300, generator=generator)
    weight = torch.randn(out_features, 300, generator=generator)
    assert onednn_linear.applies(x, weight)
    out = onednn_linear.matmul(x, weight)
    assert out.dtype == torch.float32 and out.shape == (rows, out_features)
    torch.testing.assert_close(out.double(), float64_product(x, weight), atol=1e-4, rtol=1e-5)


def test_it_takes_only_float32_cpu_matrices_of_enough_rows() -> None:
    weight = torch.randn(32, 16)
    assert onednn_linear.applies(torch.randn(onednn_linear.MIN_ROWS, 16), weight)
    assert not onednn_linear.applies(torch.randn(onednn_linear.MIN_ROWS - 1, 16), weight)
    assert not onednn_linear.applies(torch.randn(16, 16, dtype=torch.bfloat16), weight.bfloat16())
    assert not onednn_linear.applies(torch.randn(16, 16, dtype=torch.float64), weight.double())
    with torch.inference_mode():  # no version counter to see a change by: kept on torch's matmul
        inference_weight = torch.randn(32, 16)
    assert not onednn_linear.applies(torch.randn(16, 16), inference_weight)


def test_the_environment_switch_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv(onednn_linear.DISABLE_ENV, "0")
    onednn_linear.available.cache_clear()
    try:
        assert not onednn_linear.available()
        assert not onednn_linear.applies(torch.randn(32, 16), torch.randn(32, 16))
    finally:
        monkeypatch.delenv(onednn_linear.DISABLE_ENV)
        onednn_linear.available.cache_clear()
    assert onednn_linear.available()
