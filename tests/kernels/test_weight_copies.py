"""kernels/weight_copies.py and the two CPU matmuls that keep a copy of the weight through it: the copy is
made once, and made again after any in-place change to the weight, so a changed weight is never multiplied
as it was."""
from __future__ import annotations

import pytest
import torch

from loraloom.kernels import cpu_linear, onednn_linear, weight_copies


def test_a_copy_is_made_once_and_again_after_a_change() -> None:
    weight = torch.ones(3, 2)
    made = []

    def make(w: torch.Tensor) -> torch.Tensor:
        made.append(w.clone())
        return w * 10

    first = weight_copies.kept_copy(weight, "times_ten", make)
    assert weight_copies.kept_copy(weight, "times_ten", make) is first and len(made) == 1
    weight[1, 1] = 5.0
    again = weight_copies.kept_copy(weight, "times_ten", make)
    assert len(made) == 2 and again[1, 1] == 50.0 and first[1, 1] == 10.0
    assert weight_copies.can_keep_copies(torch.ones(1))  # a plain tensor keeps copies
    with torch.inference_mode():
        assert not weight_copies.can_keep_copies(torch.ones(1))


@pytest.mark.parametrize("matmul, rows", [(cpu_linear.linear, 5), (onednn_linear.matmul, 16)],
                         ids=["panel", "onednn"])
def test_each_matmul_multiplies_the_weight_as_it_is_now(matmul, rows: int) -> None:
    if matmul is onednn_linear.matmul:
        assert onednn_linear.available(), "oneDNN's linear is unavailable in this torch build"
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=generator)
    weight = torch.randn(100, 64, generator=generator)
    matmul(x, weight)  # makes and keeps the copy
    weight.mul_(-2.0)
    weight[99].zero_()
    out = matmul(x, weight)
    torch.testing.assert_close(out.double(), x.double() @ weight.double().t(), atol=1e-4, rtol=1e-5)
    assert torch.all(out[:, 99] == 0)
