"""The model's predictions of a batch's target tokens: what every training loss is computed from.

A sequence is a TokenizedExample (token ids and a loss mask); its targets are the tokens under
the mask, each predicted by the position before it. Logits are computed only where a target is
predicted: the vocabulary projection of every position would cost a fifth of the compute of a
small model, and gigabytes of activations for a long sequence with a large vocabulary.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraloom.platform.training.datasets import TokenizedExample


@dataclass(frozen=True)
class Targets:
    logits: torch.Tensor  # [num_targets, vocab] float32
    tokens: torch.Tensor  # [num_targets] the token each row of logits should predict
    rows: torch.Tensor  # [num_targets] which sequence of the batch each target belongs to


def collate(sequences: Sequence[TokenizedExample], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and loss mask of a batch."""
    length = max(len(sequence.input_ids) for sequence in sequences)
    # Padding is neither attended to nor a target, so its token id does not matter.
    input_ids = torch.zeros(len(sequences), length, dtype=torch.long)  # [batch, seq]
    attention_mask = torch.zeros(len(sequences), length, dtype=torch.long)  # [batch, seq]
    loss_mask = torch.zeros(len(sequences), length, dtype=torch.bool)  # [batch, seq]
    for row, sequence in enumerate(sequences):
        size = len(sequence.input_ids)
        input_ids[row, :size] = torch.tensor(sequence.input_ids, dtype=torch.long)
        attention_mask[row, :size] = 1
        loss_mask[row, :size] = torch.tensor(sequence.loss_mask, dtype=torch.bool)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
            "loss_mask": loss_mask.to(device)}


def target_logits(model, sequences: Sequence[TokenizedExample], device: torch.device) -> Targets:
    """The logits (float32) the PEFT `model` gives each target token of `sequences`, run as one batch."""
    batch = collate(sequences, device)
    causal_lm = model.get_base_model()
    hidden = causal_lm.get_decoder()(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state  # [batch, seq, hidden]
    # Position t predicts the token at t + 1.
    predicts_target = batch["loss_mask"][:, 1:]  # [batch, seq - 1]
    selected = hidden[:, :-1][predicts_target]  # [num_targets, hidden]
    tokens = batch["input_ids"][:, 1:][predicts_target]  # [num_targets]
    rows = torch.arange(len(sequences), device=device).unsqueeze(1).expand_as(predicts_target)[predicts_target]
    logits = causal_lm.get_output_embeddings()(selected).float()  # [num_targets, vocab]
    return Targets(logits=logits, tokens=tokens, rows=rows)


def sequence_log_probs(targets: Targets, num_sequences: int) -> torch.Tensor:
    """[num_sequences] the summed log-probability of each sequence's target tokens."""
    token_log_probs = torch.log_softmax(targets.logits, dim=-1).gather(1, targets.tokens.unsqueeze(1)).squeeze(1)
    sums = torch.zeros(num_sequences, dtype=token_log_probs.dtype, device=token_log_probs.device)
    return sums.index_add(0, targets.rows, token_log_probs)
