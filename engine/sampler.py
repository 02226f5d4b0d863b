"""Batched token sampling: greedy, temperature, top-k, top-p and per-request seeds in one pass.

Every row of the logits is one request, and each row pays only for what its
request asks: an all-greedy batch without logprobs is one argmax (on the
logits' device) and nothing per request beyond one scan of the parameters.
Sampled rows are split by need: plain temperature rows draw over their whole
row; top-k / top-p rows first look for their kept set among the row's
CANDIDATES best tokens (a top-k, far cheaper than sorting the vocabulary) and
draw over those alone, falling back to a full sort only for the rows whose
kept set does not fit. Each sampled row draws one uniform number and takes
the token where its cumulative probability passes it; a seeded request draws
that number from its own `torch.Generator`, so its tokens do not depend on
what else shares the batch.

Rows whose request adjusts its logits (penalties, logit_bias, min_tokens) have them
adjusted first, in place (engine/logit_adjustments.py); then rows with a grammar
(structured output) get -inf for every token their grammar cannot take next
(engine/structured_output.py). Only those rows pay for either. Greedy and sampled
choices read the adjusted logits, logprobs the raw ones.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from loraloom.engine.logit_adjustments import TokenHistory, adjust_logits
from loraloom.engine.request import SamplingParams
from loraloom.engine.structured_output import apply_grammar_masks

# torch.Generator.manual_seed accepts only 64-bit values; larger or negative API seeds wrap into that range.
_SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF

# How many of a filtered row's best tokens are examined before falling back to a full sort.
# Nuclei of real next-token distributions are usually far smaller; flat ones take the fallback.
CANDIDATES = 256


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
    """Index of each row's maximum (first one on ties), computed where `values` lives.

    On CUDA this stays on the device: only the [rows] result is ever copied back.
    torch's CPU argmax is not vectorized (about 12 ms for 256 x 49k floats here);
    numpy's is, and it reads the logits at memory bandwidth (about 1.5 ms, ties
    resolved to the first index like torch), so the CPU path goes through numpy
    without a copy. Splitting the rows over threads does not help: the read is
    bandwidth-bound.
    """
    if values.device.type != "cpu":
        return values.argmax(dim=-1)
    return torch.from_numpy(values.contiguous().numpy().argmax(axis=-1))


class Sampler:
    def __init__(self, eos_token_ids: Collection[int] = ()) -> None:
        self.eos_token_ids = tuple(eos_token_ids)  # what min_tokens holds back, with each request's stop tokens

    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] float32, raw model output; adjusted rows are overwritten
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        # Each row's request (tokens so far, grammar matcher); needed when a row adjusts or has a grammar.
        histories: Sequence[TokenHistory] | None = None,
    ) -> SamplerOutput:
        _check_inputs(logits, params, generators)
        num_rows = len(params)
        # The one scan over the batch: rows that sample, report logprobs or adjust their logits.
        special = [row for row, p in enumerate(params)
                   if p.temperature != 0.0 or p.logprobs is not None or p.adjusts_logits]
        raw_logprob_rows = None
        if special:
            raw_logprob_rows = self._adjust(logits, params, special, histories)
        token_ids = row_argmax(logits)  # [num_rows]; final for greedy rows
        if not special:
            return SamplerOutput(token_ids=token_ids.tolist(), logprobs=[None] * num_rows,
                                 top_logprobs=[None] * num_rows)
        random_rows = [row for row in special if params[row].temperature != 0.0]
        if random_rows:
            sampled = _sample_random(_select_rows(logits, random_rows), [params[r] for r in random_rows],
                                     [generators[r] for r in random_rows])
            if len(random_rows) == num_rows:
                token_ids = sampled
            else:
                token_ids[torch.tensor(random_rows, device=logits.device)] = sampled
        return _with_logprobs(logits, params, special, token_ids, raw_logprob_rows)

    def _adjust(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        special: list[int],
        histories: Sequence[TokenHistory] | None,
    ) -> torch.Tensor | None:
        """Adjust the rows that ask for it in place; return the raw logits of the rows that report logprobs
        when an adjustment touched one of them (None: `logits` still holds them raw)."""
        adjusted = [row for row in special if params[row].adjusts_logits]
        if not adjusted:
            return None
        if histories is None or len(histories) != len(params):
            raise ValueError("sampler histories: penalties and min_tokens read each row's tokens so far, "
                             "grammars its matcher; pass one history (the Request) per row")
        raw_logprob_rows = None
        if any(params[row].logprobs is not None for row in adjusted):
            logprob_rows = [row for row in special if params[row].logprobs is not None]
            raw_logprob_rows = logits[torch.tensor(logprob_rows, device=logits.device)]  # a copy
        values = _select_rows(logits, adjusted)  # [len(adjusted), vocab]: logits itself when every row adjusts
        adjust_logits(values, [params[row] for row in adjusted], [histories[row] for row in adjusted],
                      self.eos_token_ids)
        # Last: whatever the adjustments did, only what the grammar allows stays possible.
        constrained = [position for position, row in enumerate(adjusted) if params[row].grammar is not None]
        if constrained:
            apply_grammar_masks(values, constrained, [histories[adjusted[position]].grammar for position in constrained],
                                self.eos_token_ids)
        if values is not logits:
            logits[torch.tensor(adjusted, device=logits.device)] = values
        return raw_logprob_rows


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


def _select_rows(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """values[rows], without a copy when `rows` is every row in order."""
    if len(rows) == values.shape[0]:
        return values
    return values[torch.tensor(rows, device=values.device)]


def _top_k(params: SamplingParams, vocab_size: int) -> int:
    """The effective top-k: the whole vocabulary when disabled (0, -1) or not smaller than it."""
    return params.top_k if 0 < params.top_k < vocab_size else vocab_size


def _sample_random(
    logits: torch.Tensor,  # [rows, vocab], every row has temperature > 0
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:  # [rows] int64
    device = logits.device
    vocab_size = logits.shape[1]
    temperatures = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
    scaled = logits / temperatures[:, None]  # [rows, vocab]
    filtered = [row for row, p in enumerate(params) if _top_k(p, vocab_size) < vocab_size or p.top_p < 1.0]
    if not filtered:  # plain temperature sampling: every token is a candidate
        return _draw(scaled, None, None, generators)
    filtered_set = set(filtered)
    plain = [row for row in range(len(params)) if row not in filtered_set]
    token_ids = torch.empty(len(params), dtype=torch.int64, device=device)
    if plain:
        token_ids[torch.tensor(plain, device=device)] = _draw(
            _select_rows(scaled, plain), None, None, [generators[r] for r in plain])
    token_ids[torch.tensor(filtered, device=device)] = _sample_filtered(
        _select_rows(scaled, filtered), [params[r] for r in filtered], [generators[r] for r in filtered])
    return token_ids


def _sample_filtered(
    scaled: torch.Tensor,  # [rows, vocab], temperature applied, every row with top-k or top-p
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:  # [rows] int64
    """Top-k, then the nucleus over what top-k kept (vLLM's order); draw among the kept tokens."""
    device = scaled.device
    vocab_size = scaled.shape[1]
    top_ks = torch.tensor([_top_k(p, vocab_size) for p in params], device=device)
    top_ps = torch.tensor([p.top_p for p in params], device=device, dtype=scaled.dtype)
    values, ids = scaled.topk(min(CANDIDATES, vocab_size), dim=-1)  # [rows, K], best first
    threshold, fits = _kept_threshold(scaled, values, top_ks, top_ps)
    token_ids = torch.empty(len(params), dtype=torch.int64, device=device)
    fitting = fits.nonzero().squeeze(1)  # one device-to-host sync decides the fallback rows
    fitting_rows = fitting.tolist()
    if fitting_rows:
        token_ids[fitting] = _draw(values[fitting], ids[fitting], threshold[fitting],
                                   [generators[r] for r in fitting_rows])
    if len(fitting_rows) < len(params):
        # Kept sets larger than the candidates (flat distributions, huge top-k, ties at the edge): sort them.
        rest = (~fits).nonzero().squeeze(1)
        rest_rows = rest.tolist()
        rest_scaled = scaled[rest]
        values, ids = rest_scaled.sort(dim=-1, descending=True)  # [rest, vocab]
        threshold, _ = _kept_threshold(rest_scaled, values, top_ks[rest], top_ps[rest])
        token_ids[rest] = _draw(values, ids, threshold, [generators[r] for r in rest_rows])
    return token_ids


def _kept_threshold(
    scaled: torch.Tensor,  # [rows, vocab]
    values: torch.Tensor,  # [rows, K] each row's K largest values, best first (K may be the vocab)
    top_ks: torch.Tensor,  # [rows] effective top-k (vocab = disabled)
    top_ps: torch.Tensor,  # [rows] top-p (1 = disabled)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([rows] value threshold, [rows] bool: the kept set lies in `values`)
    """The value at or above which a token is kept, and whether every kept token is among the candidates.

    Top-k keeps the values >= the k-th largest (ties with it included). The nucleus keeps, in
    descending order, every token whose preceding probability mass (under the top-k filtered
    softmax) is below top_p, the best token always; all tokens tied with the last kept value stay.
    """
    num_candidates = values.shape[1]
    vocab_size = scaled.shape[1]
    whole_vocab = num_candidates == vocab_size
    kth_index = (top_ks.clamp(max=num_candidates) - 1)[:, None]
    kth_value = values.gather(1, kth_index).squeeze(1)  # [rows]
    kth_value = torch.where(top_ks < vocab_size, kth_value, torch.full_like(kth_value, float("-inf")))
    # Top-k fits when its k-th value is among the candidates (or it is disabled).
    fits = (top_ks <= num_candidates) | (top_ks >= vocab_size) | whole_vocab
    threshold = kth_value
    if bool((top_ps < 1.0).any()):
        # Normalizer of the top-k filtered distribution over the whole row, then the mass of the candidates.
        log_norm = scaled.masked_fill(scaled < kth_value[:, None], float("-inf")).logsumexp(dim=-1)  # [rows]
        probs = (values.masked_fill(values < kth_value[:, None], float("-inf")) - log_norm[:, None]).exp()
        mass = probs.cumsum(dim=-1)
        kept = (mass - probs < top_ps[:, None]) & (probs > 0)  # mass before each token < top_p; best always kept
        top_p_value = values.masked_fill(~kept, float("inf")).amin(dim=-1)  # smallest kept value
        uses_top_p = top_ps < 1.0
        threshold = torch.where(uses_top_p, torch.maximum(kth_value, top_p_value), kth_value)
    # When the last candidate is kept, the kept set may go on past the window: a nucleus short of
    # top_p mass, or ties with the threshold value. Such rows take the full sort.
    return threshold, fits & ((values[:, -1] < threshold) | whole_vocab)


def _draw(
    values: torch.Tensor,  # [rows, n] scaled logits of each row's candidates
    ids: torch.Tensor | None,  # [rows, n] their token ids; None: the candidates are the whole row in order
    threshold: torch.Tensor | None,  # [rows] candidates below it are excluded; None: none are
    generators: list[torch.Generator | None],
) -> torch.Tensor:  # [rows] int64 token ids
    """Draw one token per row from the softmax over its kept candidates, by inverse transform.

    One uniform number per row picks the first candidate whose cumulative probability exceeds
    it: candidate i with probability p_i. One random number per row, not one per token, is
    what keeps sampling cheap on a CPU (drawing a vocabulary's worth of random numbers per
    row cost more than the rest of the step).
    """
    if threshold is not None:
        values = values.masked_fill(values < threshold[:, None], float("-inf"))
    cdf = values.softmax(dim=-1).cumsum(dim=-1)  # [rows, n], non-decreasing
    total = cdf[:, -1:]  # [rows, 1], 1 up to rounding
    # Strictly below the total, so some column's cumulative mass exceeds it; a zero-probability
    # column adds no mass, so it is never the first to exceed it.
    target = torch.minimum(_uniforms(generators, cdf.device)[:, None] * total,
                           torch.nextafter(total, torch.zeros_like(total)))
    choice = torch.searchsorted(cdf, target, right=True)  # [rows, 1] indices into the candidates
    if ids is None:
        return choice.squeeze(1)
    return ids.gather(1, choice).squeeze(1)


def _uniforms(generators: list[torch.Generator | None], device: torch.device) -> torch.Tensor:  # [rows] in [0, 1)
    """One uniform number per row: seeded rows from their own generator (one draw per step, so
    a request's tokens do not depend on what else shares the batch), the rest from torch's global RNG."""
    uniforms = torch.rand(len(generators), device=device)
    for row, generator in enumerate(generators):
        if generator is not None:
            uniforms[row] = torch.rand(1, generator=generator, device=device)[0]
    return uniforms


def _with_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab] raw
    params: list[SamplingParams],
    special: list[int],  # the rows that sample, ask for logprobs or adjust their logits
    token_ids: torch.Tensor,  # [num_rows]
    raw_rows: torch.Tensor | None,  # [rows asking logprobs, vocab] raw, where `logits` holds adjusted ones
) -> SamplerOutput:
    sampled_ids = token_ids.tolist()
    logprobs: list[float | None] = [None] * len(params)
    top_logprobs: list[list[tuple[int, float]] | None] = [None] * len(params)
    rows = [row for row in special if params[row].logprobs is not None]
    if not rows:
        return SamplerOutput(token_ids=sampled_ids, logprobs=logprobs, top_logprobs=top_logprobs)

    index = torch.tensor(rows, device=logits.device)
    # The raw model distribution, before temperature and filtering (OpenAI's and vLLM's default):
    # logprob = logit - logsumexp(row), without materializing the whole log-softmax.
    selected = logits[index] if raw_rows is None else raw_rows  # [len(rows), vocab]
    log_norm = selected.logsumexp(dim=-1, keepdim=True)  # [len(rows), 1]
    chosen = (selected.gather(1, token_ids[index][:, None]) - log_norm).squeeze(1).tolist()
    max_top = min(max(params[row].logprobs for row in rows), logits.shape[1])
    top_ids: list[list[int]] = [[] for _ in rows]
    top_values: list[list[float]] = [[] for _ in rows]
    if max_top > 0:
        values, ids_tensor = selected.topk(max_top, dim=-1)  # [len(rows), max_top], best first
        top_values, top_ids = (values - log_norm).tolist(), ids_tensor.tolist()
    for i, row in enumerate(rows):
        k = params[row].logprobs
        logprobs[row] = chosen[i]
        top_logprobs[row] = list(zip(top_ids[i][:k], top_values[i][:k]))
    return SamplerOutput(token_ids=sampled_ids, logprobs=logprobs, top_logprobs=top_logprobs)
