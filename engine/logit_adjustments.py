"""What a request asks done to its logits before a token is chosen: penalties, logit_bias, min_tokens.

The sampler hands this module only the rows whose request asks for one of these
(SamplingParams.adjusts_logits), so a batch of plain requests never reaches it. Each
adjustment runs once over all the rows that ask for it, as tensor operations over
[rows, vocab]; Python loops run over rows and over the tokens a request names (its
history, its biased tokens), never over the vocabulary.

The definitions, applied in this order:
- repetition_penalty (vLLM and Hugging Face): every token seen in the prompt or the
  output so far has a positive logit divided by the penalty and a negative one multiplied by it.
- frequency_penalty and presence_penalty (OpenAI): logit[t] -= frequency * count[t]
  + presence * (count[t] > 0), counting t in the output so far.
- logit_bias (OpenAI): bias[t] added to logit[t].
- min_tokens (vLLM): while fewer output tokens than min_tokens exist, the tokens that would
  stop the request (engine/stop.py) get -inf. Last, so that no bias brings them back.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import numpy as np
import torch

from loraloom.engine.request import SamplingParams
from loraloom.engine.stop import stopping_token_ids


class TokenHistory(Protocol):
    """What the penalties read of a request: engine/request.py's Request has both."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]


def adjust_logits(
    values: torch.Tensor,  # [rows, vocab] float32, modified in place
    params: Sequence[SamplingParams],
    histories: Sequence[TokenHistory],
    eos_token_ids: Collection[int],
) -> None:
    if any(p.repetition_penalty != 1.0 for p in params):
        _apply_repetition_penalty(values, params, histories)
    if any(p.frequency_penalty or p.presence_penalty for p in params):
        _apply_frequency_and_presence(values, params, histories)
    if any(p.logit_bias for p in params):
        _apply_logit_bias(values, params)
    if any(p.min_tokens for p in params):
        _mask_stops_before_min_tokens(values, params, histories, eos_token_ids)


def token_counts(sequences: Sequence[Sequence[Sequence[int]]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[rows, vocab] float32: how often each token occurs in each row's sequences (a row may have several:
    the prompt and the output, counted together without concatenating them)."""
    lengths = [sum(len(part) for part in parts) for parts in sequences]
    # Padded with an id past the vocabulary, whose count lands in a column dropped below.
    padded = np.full((len(sequences), max(lengths, default=0)), vocab_size, dtype=np.int64)
    for row, parts in enumerate(sequences):
        start = 0
        for part in parts:
            padded[row, start:start + len(part)] = part
            start += len(part)
    ids = torch.from_numpy(padded).to(device)
    counts = torch.zeros(len(sequences), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab_size]


def _row_values(params: Sequence[SamplingParams], name: str, device: torch.device) -> torch.Tensor:  # [rows, 1]
    return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)[:, None]


def _apply_repetition_penalty(
    values: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]
) -> None:
    # Rows that do not ask have penalty 1 and an empty history: their logits come out unchanged.
    sequences = [(h.prompt_token_ids, h.output_token_ids) if p.repetition_penalty != 1.0 else ()
                 for p, h in zip(params, histories)]
    seen = token_counts(sequences, values.shape[1], values.device) > 0
    penalty = _row_values(params, "repetition_penalty", values.device).expand_as(values)
    scaled = torch.where(values > 0, values / penalty, values * penalty)
    values.copy_(torch.where(seen, scaled, values))


def _apply_frequency_and_presence(
    values: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]
) -> None:
    sequences = [(h.output_token_ids,) if p.frequency_penalty or p.presence_penalty else ()
                 for p, h in zip(params, histories)]
    counts = token_counts(sequences, values.shape[1], values.device)
    frequency = _row_values(params, "frequency_penalty", values.device)
    presence = _row_values(params, "presence_penalty", values.device)
    values -= frequency * counts + presence * (counts > 0)


def _apply_logit_bias(values: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    rows, tokens, biases = [], [], []
    for row, p in enumerate(params):
        rows.extend([row] * len(p.logit_bias))
        tokens.extend(p.logit_bias)
        biases.extend(p.logit_bias.values())
    device = values.device
    values.index_put_((torch.tensor(rows, device=device), torch.tensor(tokens, device=device)),
                      torch.tensor(biases, dtype=values.dtype, device=device), accumulate=True)


def _mask_stops_before_min_tokens(
    values: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[TokenHistory],
    eos_token_ids: Collection[int],
) -> None:
    rows, tokens = [], []
    for row, (p, history) in enumerate(zip(params, histories)):
        if len(history.output_token_ids) < p.min_tokens:
            # Ids past the vocabulary can never be sampled, so need no mask.
            stopping = [token for token in stopping_token_ids(p, eos_token_ids) if token < values.shape[1]]
            rows.extend([row] * len(stopping))
            tokens.extend(stopping)
    if rows:
        device = values.device
        values[torch.tensor(rows, device=device), torch.tensor(tokens, device=device)] = float("-inf")
