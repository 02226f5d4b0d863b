"""Sampling a step whose requests may verify drafts: which proposed tokens the request's own model makes.

A request with a draft x_1..x_k was computed on k + 1 rows in one forward: the row of its last token
and one row per proposal, so row j holds the logits the request would have after accepting x_1..x_j.
The rows are then sampled in rounds, exactly as decoding would sample them one step at a time: round j
samples row j of every request still going, its history (penalties, min_tokens, its grammar) extended
by the proposals accepted so far, and a request goes on to round j + 1 only if the token drawn in round
j is x_{j+1} and decoding would not have stopped there. Each round adds one token per request: the
accepted proposals, then the first token that differs (or the one after the last proposal).

Why this is exact in every sampling mode: each token is drawn from the very distribution decoding
would draw it from (adjusted, masked, tempered, filtered), with one uniform number per token as
decoding draws. A proposal x is kept with probability p(x); on a miss the token drawn follows p with x
removed and renormalized, the rule for a deterministic proposal. A seeded request takes from its
generator exactly what decoding takes, so speculation does not change its output.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from loraloom.engine.request import Request
from loraloom.engine.sampler import Sampler, SamplerOutput
from loraloom.engine.stop import stopping_token_ids

TopLogprobs = list[tuple[int, float]] | None


@dataclass
class StepTokens:
    """What one step sampled, per request that samples (in scheduled order): its tokens, one or, after a
    verified draft, several; per token the sampled token's raw logprob and the top ones (None: not asked)."""

    token_ids: list[list[int]]
    logprobs: list[list[float | None]]
    top_logprobs: list[list[TopLogprobs]]

    @classmethod
    def one_each(cls, sampled: SamplerOutput) -> "StepTokens":
        return cls([[token] for token in sampled.token_ids], [[value] for value in sampled.logprobs],
                   [[top] for top in sampled.top_logprobs])


class _DraftedHistory:
    """A request's tokens as the penalties and its grammar read them after accepting some proposals."""

    __slots__ = ("prompt_token_ids", "output_token_ids", "grammar")

    def __init__(self, request: Request, accepted: list[int]) -> None:
        self.prompt_token_ids = request.prompt_token_ids
        self.output_token_ids = request.output_token_ids + accepted
        self.grammar = request.grammar


def sample_step(
    sampler: Sampler,
    logits: torch.Tensor,  # [rows, vocab]: 1 + len(drafts[i]) consecutive rows per request i
    requests: Sequence[Request],
    drafts: Sequence[Sequence[int]],
    generators: list[torch.Generator | None],
    failed: Collection[int] = (),  # requests whose logits were not finite: one (meaningless) token each
) -> StepTokens:
    params = [request.sampling_params for request in requests]
    if len(logits) == len(requests):  # no draft in the step: one round
        return StepTokens.one_each(sampler.sample(logits, params, generators, requests))
    starts = [0] * len(requests)
    for index in range(1, len(requests)):
        starts[index] = starts[index - 1] + 1 + len(drafts[index - 1])
    tokens: list[list[int]] = [[] for _ in requests]
    logprobs: list[list[float | None]] = [[] for _ in requests]
    tops: list[list[TopLogprobs]] = [[] for _ in requests]
    advanced = [0] * len(requests)  # proposals each request's grammar matcher consumed, rolled back at the end
    going = list(range(len(requests)))
    depth = 0
    while going:
        rows = torch.tensor([starts[index] + depth for index in going], device=logits.device)
        histories = [requests[index] if depth == 0 or not params[index].adjusts_logits
                     else _DraftedHistory(requests[index], tokens[index]) for index in going]
        sampled = sampler.sample(logits[rows], [params[index] for index in going],
                                 [generators[index] for index in going], histories)
        still_going = []
        for position, index in enumerate(going):
            token = sampled.token_ids[position]
            tokens[index].append(token)
            logprobs[index].append(sampled.logprobs[position])
            tops[index].append(sampled.top_logprobs[position])
            if index not in failed and _accepted(requests[index], drafts[index], depth, token, sampler.eos_token_ids):
                if requests[index].grammar is not None:
                    requests[index].grammar.accept(token)
                    advanced[index] += 1
                    if requests[index].grammar.finished:
                        continue  # the grammar is complete: decoding would stop at this token
                still_going.append(index)
        going = still_going
        depth += 1
    for index, count in enumerate(advanced):
        if count:  # the output processor advances each matcher through the emitted tokens, as after decoding
            requests[index].grammar.rollback(count)
    return StepTokens(tokens, logprobs, tops)


def _accepted(request: Request, draft: Sequence[int], depth: int, token: int, eos_token_ids: Collection[int]) -> bool:
    """Whether the token drawn at `depth` is the request's next proposal and decoding would go on after it."""
    if depth >= len(draft) or token != draft[depth]:
        return False
    params = request.sampling_params
    if len(request.output_token_ids) + depth + 1 >= params.max_tokens:
        return False
    return token not in stopping_token_ids(params, eos_token_ids)
