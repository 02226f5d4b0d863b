"""Direct Preference Optimization's objective (Rafailov et al., 2023), on preference pairs.

For a pair (prompt x, preferred answer c, non-preferred answer r), with log-probabilities summed
over each answer's tokens under the trained policy (pi) and the frozen reference (ref):

    loss = -log sigmoid(beta * ((pi(c|x) - ref(c|x)) - (pi(r|x) - ref(r|x))))

The reference is the model the job starts from (the base, plus the starting adapter of a job
started from a checkpoint). Its log-probabilities are computed once, before the first step, with
that very model in eval mode under no_grad: exact, and no second model in memory. A resumed run
computes them again from the same starting weights before loading the checkpoint's, so they are
the uninterrupted run's.

Metrics: `train_loss` / `valid_loss` are that loss's mean over the pairs of the batch / of the
validation file; `*_reward_margin` the mean of beta x (the gain of c minus the gain of r), the
"implicit reward" margin, and `*_reward_accuracy` the share of pairs whose margin is positive.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from loraloom.platform.training.datasets import TokenizedExample
from loraloom.platform.training.lm_targets import sequence_log_probs, target_logits
from loraloom.platform.training.preference_data import PreferenceExample


def answer_sequences(pairs: Sequence[PreferenceExample]) -> list[TokenizedExample]:
    """The preferred answers' sequences, then the non-preferred ones': prompt + answer, loss on the answer."""
    sequences = []
    for answers in ("chosen_ids", "rejected_ids"):
        for pair in pairs:
            answer = getattr(pair, answers)
            sequences.append(TokenizedExample(
                line=pair.line, input_ids=pair.prompt_ids + answer,
                loss_mask=(False,) * len(pair.prompt_ids) + (True,) * len(answer),
            ))
    return sequences


def answer_log_probs(model, pairs: Sequence[PreferenceExample], device: torch.device) -> torch.Tensor:
    """[len(pairs), 2]: each pair's summed log-probability of its preferred and its non-preferred answer."""
    sequences = answer_sequences(pairs)
    log_probs = sequence_log_probs(target_logits(model, sequences, device), len(sequences))
    return torch.stack([log_probs[:len(pairs)], log_probs[len(pairs):]], dim=1)


def dpo_terms(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair: (DPO loss, reward margin), from [pairs, 2] log-probabilities (preferred, non-preferred)."""
    gains = policy - reference  # [pairs, 2]
    margins = beta * (gains[:, 0] - gains[:, 1])  # [pairs]
    return -torch.nn.functional.logsigmoid(margins), margins


class DpoObjective:
    def __init__(self, train_examples: Sequence[PreferenceExample], eval_examples: Sequence[PreferenceExample],
                 batch_size: int, beta: float, device: torch.device) -> None:
        self.train_examples, self.eval_examples = train_examples, eval_examples
        self.batch_size, self.beta, self.device = batch_size, beta, device
        self.train_reference: torch.Tensor | None = None  # [train pairs, 2]
        self.eval_reference: torch.Tensor | None = None  # [validation pairs, 2]

    def prepare(self, model) -> None:
        """The reference log-probabilities: the model as the job starts, before any step."""
        self.train_reference = self._log_probs_without_grad(model, self.train_examples)
        self.eval_reference = self._log_probs_without_grad(model, self.eval_examples)

    def train_step(self, model, indices: Sequence[int]) -> tuple[torch.Tensor, dict[str, float]]:
        assert self.train_reference is not None, "prepare() computes the reference before the first step"
        policy = answer_log_probs(model, [self.train_examples[i] for i in indices], self.device)
        losses, margins = dpo_terms(policy, self.train_reference[list(indices)].to(self.device), self.beta)
        loss = losses.mean()
        return loss, {"train_loss": loss.item(), "train_reward_margin": margins.mean().item(),
                      "train_reward_accuracy": (margins > 0).float().mean().item()}

    def evaluate(self, model) -> dict[str, float]:
        assert self.eval_reference is not None, "prepare() computes the reference before the first step"
        policy = self._log_probs_without_grad(model, self.eval_examples)
        losses, margins = dpo_terms(policy, self.eval_reference, self.beta)
        return {"valid_loss": losses.mean().item(), "valid_reward_margin": margins.mean().item(),
                "valid_reward_accuracy": (margins > 0).float().mean().item()}

    def _log_probs_without_grad(self, model, pairs: Sequence[PreferenceExample]) -> torch.Tensor:
        """[len(pairs), 2] in float32 on the CPU, in eval mode (no dropout), batch by batch."""
        model.eval()
        parts = [torch.zeros(0, 2)]
        with torch.no_grad():
            for first in range(0, len(pairs), self.batch_size):
                parts.append(answer_log_probs(model, pairs[first:first + self.batch_size], self.device).cpu())
        model.train()
        return torch.cat(parts)
