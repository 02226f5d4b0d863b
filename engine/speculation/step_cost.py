"""What one more row costs a step, measured: the price a proposed token must be worth.

A step's model time grows with the rows it computes: t = fixed + per_row * rows. The fixed part is
reading the weights (and the launch overheads); the per-row part is the compute. A proposed token adds a
row to the step, paid by every request in it, and returns a token only if it is accepted. Adding it
raises throughput only when its chance of acceptance exceeds the share of the step's time the batch's
rows take, per_row * n / (fixed + per_row * n) for n requests. On a GPU serving a big model at a small
batch that share is small and almost any proposal pays; on a CPU, or at a large batch, the rows are most
of the step and only likely proposals pay.

The two coefficients are a least-squares fit of the engine's recent steps (model time against rows),
exponentially weighted so that it follows load changes; steps differ in rows (prefill chunks, drafts,
batch size), which is what makes the fit possible. Until it has seen steps of different sizes it
assumes DEFAULT_ROW_SHARE.
"""
from __future__ import annotations

# The share assumed before the fit has data: modest, so that early drafts are tried but only likely ones.
DEFAULT_ROW_SHARE = 0.25
# Each step's weight in the fit decays by this factor per step: about the last 200 steps count.
DECAY = 0.995
MIN_STEPS = 16


class StepCost:
    def __init__(self) -> None:
        self._weight = self._x = self._y = self._xx = self._xy = 0.0
        self._steps = 0

    def observe(self, rows: int, seconds: float) -> None:
        """One step's rows (tokens computed) and model time."""
        for name in ("_weight", "_x", "_y", "_xx", "_xy"):
            setattr(self, name, getattr(self, name) * DECAY)
        self._weight += 1.0
        self._x += rows
        self._y += seconds
        self._xx += rows * rows
        self._xy += rows * seconds
        self._steps += 1

    def row_share(self, requests: int) -> float:
        """The share of a step's time that `requests` decoding requests' rows take (0 to 1)."""
        fit = self._fit()
        if fit is None:
            return DEFAULT_ROW_SHARE
        fixed, per_row = fit
        rows_time = per_row * max(requests, 1)
        return rows_time / (fixed + rows_time) if fixed + rows_time > 0 else DEFAULT_ROW_SHARE

    def _fit(self) -> tuple[float, float] | None:
        if self._steps < MIN_STEPS:
            return None
        mean_x, mean_y = self._x / self._weight, self._y / self._weight
        variance = self._xx / self._weight - mean_x * mean_x
        if variance < 1e-6 * max(mean_x * mean_x, 1.0):
            return None  # every step the same size: the two parts cannot be told apart
        per_row = max((self._xy / self._weight - mean_x * mean_y) / variance, 0.0)
        fixed = max(mean_y - per_row * mean_x, 0.0)
        return fixed, per_row
