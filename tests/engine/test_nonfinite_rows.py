"""nonfinite_rows: which logit rows hold a NaN or an infinity (those requests fail alone)."""
from __future__ import annotations

import torch

from loraloom.engine.model_runner import nonfinite_rows


def test_rows_with_nan_or_infinity_are_found_and_no_others():
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    logits[1, 7] = float("nan")
    logits[3, 999] = float("inf")
    logits[4, 0] = float("-inf")
    logits[5, 10], logits[5, 11] = float("inf"), float("-inf")  # sums to NaN
    assert nonfinite_rows(logits) == [1, 3, 4, 5]


def test_a_finite_row_whose_sum_overflows_is_not_failed():
    logits = torch.zeros(3, 100)
    logits[2, :4] = 3e38  # every value finite, the row sum infinite
    logits[0, 5] = float("nan")
    assert nonfinite_rows(logits) == [0]


def test_a_finite_batch_has_no_failed_rows():
    assert nonfinite_rows(torch.randn(32, 49152) * 30) == []
