"""A job's step schedule: how many optimizer steps it takes and at which ones it evaluates.

One function each, used by the trainer to run the job and by the job API to estimate it
beforehand, so that the estimate's steps, evaluations and trained tokens are the run's.

Evaluation steps: every `eval_interval` steps, and always the final step, so a job with a
validation file ends with the loss of the adapter it returns. `"auto"` (the default) evaluates
AUTO_EVALUATIONS times over the run, evenly spaced: 4 times an epoch at the default 3 epochs,
every step for a job of at most AUTO_EVALUATIONS steps. It is defined on the total steps alone
(not per epoch) so that the schedule follows from (total steps, eval_interval) and nothing else.
"""
from __future__ import annotations

import math
from typing import Literal

AUTO = "auto"
AUTO_EVALUATIONS = 12


def total_steps(n_examples: int, batch_size: int, n_epochs: int) -> int:
    """Optimizer steps of a run: every epoch is ceil(n_examples / batch_size) batches, the last one short."""
    if n_examples < 1 or batch_size < 1 or n_epochs < 1:
        raise ValueError(f"total_steps: n_examples {n_examples}, batch_size {batch_size} and n_epochs {n_epochs} "
                         "must all be >= 1")
    return n_epochs * math.ceil(n_examples / batch_size)


def eval_interval_steps(total: int, eval_interval: int | Literal["auto"]) -> int:
    """The steps between two evaluations: `eval_interval` itself, or what "auto" means for `total` steps."""
    if eval_interval == AUTO:
        return max(1, math.ceil(total / AUTO_EVALUATIONS))
    if isinstance(eval_interval, bool) or not isinstance(eval_interval, int) or eval_interval < 1:
        raise ValueError(f"eval_interval: must be an integer >= 1 or \"auto\", got {eval_interval!r}")
    return eval_interval


def evaluation_steps(total: int, eval_interval: int | Literal["auto"]) -> list[int]:
    """The steps (1-based, ascending) after which the validation examples are evaluated; the last is `total`."""
    if total < 1:
        raise ValueError(f"evaluation_steps: total steps must be >= 1, got {total}")
    interval = eval_interval_steps(total, eval_interval)
    steps = list(range(interval, total + 1, interval))
    if not steps or steps[-1] != total:
        steps.append(total)
    return steps
