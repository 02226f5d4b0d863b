"""The step schedule the trainer runs and the job API estimates with: steps and evaluation steps."""
from __future__ import annotations

import pytest

from loraloom.platform.training.schedule import AUTO_EVALUATIONS, evaluation_steps, total_steps


def test_total_steps_counts_the_short_last_batch_of_every_epoch() -> None:
    assert total_steps(7, 2, 3) == 12
    assert total_steps(6, 2, 2) == 6
    assert total_steps(1, 8, 1) == 1
    with pytest.raises(ValueError, match="n_examples 0"):
        total_steps(0, 2, 1)


@pytest.mark.parametrize(("total", "interval", "expected"), [
    (6, 2, [2, 4, 6]),
    (7, 2, [2, 4, 6, 7]),  # the last step is always evaluated
    (3, 10, [3]),
    (5, 1, [1, 2, 3, 4, 5]),
    (5, "auto", [1, 2, 3, 4, 5]),  # a tiny job: every step
    (AUTO_EVALUATIONS, "auto", list(range(1, AUTO_EVALUATIONS + 1))),
    (48, "auto", list(range(4, 49, 4))),  # 16 steps an epoch over 3 epochs: 4 evaluations an epoch
    (50, "auto", [5, 10, 15, 20, 25, 30, 35, 40, 45, 50]),
])
def test_evaluation_steps(total: int, interval: int | str, expected: list[int]) -> None:
    assert evaluation_steps(total, interval) == expected


@pytest.mark.parametrize("interval", [0, -1, "3", True, 2.0])
def test_a_bad_interval_is_refused(interval: object) -> None:
    with pytest.raises(ValueError, match="eval_interval"):
        evaluation_steps(10, interval)  # type: ignore[arg-type]
