"""verify.py on synthetic logits: a draft's tokens are kept with the model's probability of them, and the
token drawn after a rejection follows the model's distribution without the proposal, so the tokens a
request emits are distributed exactly as decoding's (a chi-square test over many requests at once)."""
from __future__ import annotations

import torch

from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.sampler import Sampler
from loraloom.engine.speculation.verify import sample_step

# The 0.1% critical values of chi-square: a correct sampler fails one run in a thousand, a wrong one
# (proposals kept too often, or redrawn without being excluded) by far more than these.
CRITICAL = {3: 16.27, 4: 18.47}
REQUESTS = 6000


def chi_square(observed: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * observed.sum()
    kept = expected > 0
    assert observed[~kept].sum() == 0, "a token of probability 0 was emitted"
    return float((((observed - expected) ** 2)[kept] / expected[kept]).sum())


def test_drafted_tokens_follow_the_model_distribution_at_each_position():
    torch.manual_seed(7)
    first = torch.tensor([1.2, 0.3, 1.0, -0.5, 0.1])  # the logits after the request's last token
    second = torch.tensor([-0.2, 0.9, 0.4, 1.1, -1.0])  # after the proposal, had it been accepted
    proposal = 2
    params = SamplingParams(max_tokens=50, temperature=0.8, top_k=4)
    requests = [Request(f"r{index}", [1, 2, 3], params) for index in range(REQUESTS)]
    logits = torch.stack([first, second] * REQUESTS)
    sampled = sample_step(Sampler(eos_token_ids=()), logits, requests, [[proposal]] * REQUESTS, [None] * REQUESTS)

    def model(values: torch.Tensor) -> torch.Tensor:  # top-k 4 of the tempered logits, as the sampler filters
        tempered = values / params.temperature
        tempered[tempered < tempered.topk(4).values[-1]] = float("-inf")
        return tempered.softmax(-1)

    firsts = torch.tensor([tokens[0] for tokens in sampled.token_ids])
    assert chi_square(torch.bincount(firsts, minlength=5).float(), model(first.clone())) < CRITICAL[3]
    # A token follows only an accepted proposal, and then from the next row's distribution.
    assert all((len(tokens) == 2) == (tokens[0] == proposal) for tokens in sampled.token_ids)
    seconds = torch.tensor([tokens[1] for tokens in sampled.token_ids if len(tokens) == 2])
    assert len(seconds) > 1000
    assert chi_square(torch.bincount(seconds, minlength=5).float(), model(second.clone())) < CRITICAL[3]


def test_a_proposal_the_model_cannot_make_is_never_kept_and_costs_no_extra_draw():
    logits = torch.tensor([[0.0, 5.0, float("-inf")], [1.0, 1.0, 1.0]])  # token 2 impossible after the last token
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    request = Request("r", [1], params)
    generator = torch.Generator().manual_seed(3)
    reference = torch.Generator().manual_seed(3)
    sampled = sample_step(Sampler(), logits, [request], [[2]], [generator])
    assert len(sampled.token_ids[0]) == 1 and sampled.token_ids[0][0] != 2
    torch.rand(1, generator=reference)  # decoding would have drawn exactly one number for this token
    assert torch.equal(generator.get_state(), reference.get_state())
