"""Supervised fine-tuning's objective: cross-entropy on the examples' loss-mask tokens.

Metrics in OpenAI's names: a step's `train_loss` (mean over the batch's target tokens) and
`train_mean_token_accuracy` (the share of those targets the model ranks first); an evaluation's
`valid_loss` and `valid_mean_token_accuracy`, the same over every target of the validation
examples (a mean over tokens, not of batch means), without dropout.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from loraloom.platform.training.datasets import TokenizedExample
from loraloom.platform.training.lm_targets import Targets, target_logits


class SupervisedObjective:
    def __init__(self, train_examples: Sequence[TokenizedExample], eval_examples: Sequence[TokenizedExample],
                 batch_size: int, device: torch.device) -> None:
        self.train_examples, self.eval_examples = train_examples, eval_examples
        self.batch_size, self.device = batch_size, device

    def prepare(self, model) -> None:
        """Nothing to compute before the first step."""

    def train_step(self, model, indices: Sequence[int]) -> tuple[torch.Tensor, dict[str, float]]:
        """The batch's mean loss (to backpropagate) and its metrics."""
        targets = target_logits(model, [self.train_examples[i] for i in indices], self.device)
        loss_sum, correct = _loss_sum_and_correct(targets)
        loss = loss_sum / targets.tokens.numel()
        return loss, {"train_loss": loss.item(), "train_mean_token_accuracy": correct / targets.tokens.numel()}

    def evaluate(self, model) -> dict[str, float]:
        model.eval()
        total_loss = 0.0
        total_correct = total_targets = 0
        with torch.no_grad():
            for first in range(0, len(self.eval_examples), self.batch_size):
                targets = target_logits(model, self.eval_examples[first:first + self.batch_size], self.device)
                loss_sum, correct = _loss_sum_and_correct(targets)
                total_loss += loss_sum.item()
                total_correct += correct
                total_targets += targets.tokens.numel()
        model.train()
        return {"valid_loss": total_loss / total_targets, "valid_mean_token_accuracy": total_correct / total_targets}


def _loss_sum_and_correct(targets: Targets) -> tuple[torch.Tensor, int]:
    loss_sum = torch.nn.functional.cross_entropy(targets.logits, targets.tokens, reduction="sum")
    correct = int((targets.logits.detach().argmax(dim=-1) == targets.tokens).sum())
    return loss_sum, correct
