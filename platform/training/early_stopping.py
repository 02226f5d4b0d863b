"""Early stopping: end a run once its validation loss has stopped improving, keeping its best weights.

After each evaluation the tracker compares `valid_loss` with the best so far. A lower loss is the
new best: its step, its validation metrics and a copy of the LoRA weights (small: the adapter only)
are kept. Otherwise one more evaluation has gone by without improvement, and after `patience` of
them in a row the run stops. A run with early stopping returns the best evaluation's weights,
whether it stopped early or ran all its steps.

The whole state, best weights included, goes into every checkpoint's training state (resume.py),
so a resumed run stops where, and with what, the uninterrupted one would have.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class EarlyStopping:
    patience: int  # evaluations in a row without a lower valid_loss that end the run
    best_loss: float = math.inf
    best_step: int | None = None
    best_metrics: dict[str, float] = field(default_factory=dict)  # the best evaluation's valid_* metrics
    evaluations_since_best: int = 0
    best_weights: dict[str, torch.Tensor] | None = None  # the LoRA state dict at best_step, on the CPU

    def observe(self, step: int, metrics: dict[str, float], weights: Callable[[], dict[str, torch.Tensor]]) -> bool:
        """Record the evaluation of `step`; True when the run should stop. `weights` is called only for a new best."""
        if metrics["valid_loss"] < self.best_loss:
            self.best_loss, self.best_step, self.best_metrics = metrics["valid_loss"], step, dict(metrics)
            self.evaluations_since_best = 0
            self.best_weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights().items()}
            return False
        self.evaluations_since_best += 1
        return self.evaluations_since_best >= self.patience

    def to_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """(JSON-able counters, the best weights) for a checkpoint."""
        counters = {"patience": self.patience, "best_loss": self.best_loss, "best_step": self.best_step,
                    "best_metrics": self.best_metrics, "evaluations_since_best": self.evaluations_since_best}
        return counters, dict(self.best_weights or {})

    @classmethod
    def from_state(cls, counters: dict, best_weights: dict[str, torch.Tensor]) -> EarlyStopping:
        return cls(patience=counters["patience"], best_loss=counters["best_loss"], best_step=counters["best_step"],
                   best_metrics=counters["best_metrics"], evaluations_since_best=counters["evaluations_since_best"],
                   best_weights=best_weights or None)
