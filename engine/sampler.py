"""Batched token sampling: greedy, temperature, top-k, top-p and per-request seeds in one pass.

Every row of the logits is one request. The filtering and the draw are tensor
ops over all rows at once; only the random noise is drawn row by row, because
each seeded request owns a `torch.Generator` and its draws must not depend on
what else shares the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from loraloom.engine.request import SamplingParams

# torch.Generator.manual_seed accepts only 64-bit values; larger or negative API seeds wrap into that range.
_SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # The sampled token's logprob under the raw model distribution; None where the request asked none.
    logprobs: list[float | None]
    # (token_id, logprob) of the k most likely tokens, best first; [] for logprobs=0, None where not asked.
    top_logprobs: list[list[tuple[int, float]] | None]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The request's own random stream; None (no seed) means the request draws from torch's global RNG.

    Create it once per request and keep it for the request's lifetime: each step advances it.
    `device` must be the device the logits live on.
    """
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed & _SEED_MASK)
    return generator


def row_argmax(values: torch.Tensor) -> torch.Tensor:  # [rows, vocab] -> [rows] int64
    """Index of each row's maximum (first one on ties).

    torch's CPU argmax is not vectorized (16 ms for 256 x 49k floats here, numpy's
    is 9x faster), and this sits on the per-step path, so the CPU path goes
    through numpy without a copy.
    """
    if values.device.type != "cpu":
        return values.argmax(dim=-1)
    return torch.from_numpy(values.contiguous().numpy().argmax(axis=-1))


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] float32, raw model output
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> SamplerOutput:
        _check_inputs(logits, params, generators)
        random_rows = [row for row, p in enumerate(params) if not p.greedy]
        if not random_rows:
            token_ids = row_argmax(logits)  # [num_rows]
        elif len(random_rows) == len(params):
            token_ids = _sample_filtered(logits, params, generators)
        else:
            token_ids = row_argmax(logits)
            index = torch.tensor(random_rows, device=logits.device)
            token_ids[index] = _sample_filtered(
                logits[index], [params[r] for r in random_rows], [generators[r] for r in random_rows]
            )
        return _with_logprobs(logits, params, token_ids)


def _check_inputs(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(
            f"sampler logits: expected a 2-D float32 tensor [num_rows, vocab], got {tuple(logits.shape)} "
            f"{logits.dtype}; cast the model output with .float()"
        )
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError(
            f"sampler: got {logits.shape[0]} logit rows, {len(params)} params and {len(generators)} generators; "
            "pass one SamplingParams and one generator (or None) per row"
        )


def _sample_filtered(
    logits: torch.Tensor,  # [rows, vocab], every row has temperature > 0
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:  # [rows] int64
    device = logits.device
    vocab_size = logits.shape[1]
    temperatures = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
    scaled = logits / temperatures[:, None]  # [rows, vocab]

    top_ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    uses_top_k = any(k < vocab_size for k in top_ks)
    uses_top_p = any(p.top_p < 1.0 for p in params)
    if uses_top_p:
        # One sort serves both filters: top-k first, then the nucleus over what top-k kept (vLLM's order).
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)  # [rows, vocab]
        if uses_top_k:
            sorted_logits = _mask_below_kth(sorted_logits, sorted_logits, top_ks)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exactly 0 for the best token: it always stays
        # top_p == 1 rows get an infinite bound so rounding in the cumsum never drops their tail.
        top_ps = torch.tensor(
            [p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=device, dtype=logits.dtype
        )
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_ps[:, None], float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, sorted_ids, sorted_logits)
    elif uses_top_k:
        top_values = scaled.topk(max(top_ks), dim=-1).values  # [rows, max_k], descending
        scaled = _mask_below_kth(scaled, top_values, top_ks)

    probs = scaled.softmax(dim=-1)  # [rows, vocab]
    # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks i with probability p_i.
    noise = _exponential_noise(probs, generators)
    return row_argmax(probs / noise)


def _mask_below_kth(
    values: torch.Tensor,  # [rows, vocab] to filter
    descending: torch.Tensor,  # [rows, >= max k] the same rows' values sorted best first
    top_ks: list[int],
) -> torch.Tensor:
    """Set to -inf every value below its row's k-th largest (ties with the k-th are kept)."""
    kth_index = torch.tensor(top_ks, device=values.device)[:, None] - 1  # [rows, 1]
    kth_value = descending.gather(1, kth_index)  # [rows, 1]
    return values.masked_fill(values < kth_value, float("-inf"))


def _exponential_noise(
    probs: torch.Tensor,  # [rows, vocab]
    generators: list[torch.Generator | None],
) -> torch.Tensor:  # [rows, vocab], Exp(1) samples
    noise = torch.empty_like(probs)
    if all(g is None for g in generators):
        noise.exponential_()
    else:
        # Each seeded row draws exactly `vocab` values from its own generator, so its tokens
        # are the same alone or in any batch.
        for row, generator in enumerate(generators):
            noise[row].exponential_(generator=generator)
    # A zero draw would turn a zero-probability token into 0/0 = NaN, which argmax would pick.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def _with_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab] raw
    params: list[SamplingParams],
    token_ids: torch.Tensor,  # [num_rows]
) -> SamplerOutput:
    sampled_ids = token_ids.tolist()
    logprobs: list[float | None] = [None] * len(params)
    top_logprobs: list[list[tuple[int, float]] | None] = [None] * len(params)
    rows = [row for row, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return SamplerOutput(token_ids=sampled_ids, logprobs=logprobs, top_logprobs=top_logprobs)

    index = torch.tensor(rows, device=logits.device)
    # The raw model distribution, before temperature and filtering (OpenAI's and vLLM's default).
    raw_logprobs = torch.log_softmax(logits[index], dim=-1)  # [len(rows), vocab]
    chosen = raw_logprobs.gather(1, token_ids[index][:, None]).squeeze(1).tolist()
    max_top = min(max(params[row].logprobs for row in rows), logits.shape[1])
    top_ids: list[list[int]] = [[] for _ in rows]
    top_values: list[list[float]] = [[] for _ in rows]
    if max_top > 0:
        values, ids_tensor = raw_logprobs.topk(max_top, dim=-1)  # [len(rows), max_top], best first
        top_values, top_ids = values.tolist(), ids_tensor.tolist()
    for i, row in enumerate(rows):
        k = params[row].logprobs
        logprobs[row] = chosen[i]
        top_logprobs[row] = list(zip(top_ids[i][:k], top_values[i][:k]))
    return SamplerOutput(token_ids=sampled_ids, logprobs=logprobs, top_logprobs=top_logprobs)
