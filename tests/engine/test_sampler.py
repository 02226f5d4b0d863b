"""The batched sampler against fp64 references computed independently of its code."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from loraloom.engine.request import SamplingParams
from loraloom.engine.sampler import CANDIDATES, Sampler, make_generator


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator) * scale  # [rows, vocab] float32


def reference_distribution(logits_row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The filtered distribution in fp64, written from the definitions: top-k, then the smallest nucleus."""
    probs = torch.softmax(logits_row.double() / temperature, dim=-1)
    order = probs.argsort(descending=True).tolist()
    if top_k > 0:
        order = order[:top_k]
    kept_probs = probs[order] / probs[order].sum()
    nucleus, mass = [], 0.0
    for token, p in zip(order, kept_probs.tolist()):
        nucleus.append(token)
        mass += p
        if mass >= top_p:
            break
    filtered = torch.zeros_like(probs)
    filtered[nucleus] = probs[nucleus]
    return filtered / filtered.sum()


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = random_logits(6, 100, seed=0)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.0, top_p=0.3),  # filters do not matter when greedy
        SamplingParams(temperature=1.2, top_p=0.9),
        SamplingParams(temperature=0.0, seed=3),
        SamplingParams(temperature=0.7),
    ]
    out = Sampler().sample(logits, params, [make_generator(p.seed) for p in params])
    expected = logits.double().argmax(dim=-1).tolist()
    for row in (0, 2, 4):
        assert out.token_ids[row] == expected[row]
    assert all(0 <= t < 100 for t in out.token_ids)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_top_k_one_and_tiny_top_p_equal_greedy(seed):
    logits = random_logits(8, 500, seed=seed, scale=1.0)
    params = [SamplingParams(temperature=1.5, top_k=1)] * 4 + [SamplingParams(temperature=1.5, top_p=1e-6)] * 4
    generators = [make_generator(seed * 10 + i) if i % 2 else None for i in range(8)]
    out = Sampler().sample(logits, params, generators)
    assert out.token_ids == logits.double().argmax(dim=-1).tolist()


def test_seeded_row_gives_the_same_tokens_alone_or_in_any_batch():
    sampler = Sampler()
    vocab, steps = 400, 12
    filtered = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=1234)
    plain = SamplingParams(temperature=0.8, seed=99)  # takes the unsorted path when alone
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=1.0, top_k=7, seed=5),
    ]

    def run(batch_params: list[SamplingParams], watched: dict[int, int]) -> list[list[int]]:
        """Tokens of the watched rows ({batch index: logits stream}) over `steps` steps."""
        generators = [make_generator(p.seed) for p in batch_params]
        tokens = []
        for step in range(steps):
            logits = random_logits(len(batch_params), vocab, seed=1000 + step, scale=1.0)
            # A watched row sees its own logits stream, wherever it sits in the batch.
            for index, stream in watched.items():
                logits[index] = random_logits(1, vocab, seed=stream * 100 + step, scale=1.0)[0]
            out = sampler.sample(logits, batch_params, generators)
            tokens.append([out.token_ids[i] for i in watched])
        return tokens

    alone_filtered = [t[0] for t in run([filtered], {0: 1})]
    alone_plain = [t[0] for t in run([plain], {0: 2})]
    batched = run([others[0], filtered, others[1], plain, others[2]], {1: 1, 3: 2})
    assert [t[0] for t in batched] == alone_filtered
    assert [t[1] for t in batched] == alone_plain

    other_seed = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=4321)
    assert [t[0] for t in run([other_seed], {0: 1})] != alone_filtered


def chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's statistic over the tokens with nonzero expected probability."""
    support = expected_probs > 0
    total = counts.sum()
    expected = expected_probs[support] * total
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof == 0:
        return 1.0
    # The chi-square survival function is the regularized upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), statistic / 2.0))


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (1.4, 5, 0.8), (1.0, -1, 0.95)],
)
def test_sample_frequencies_match_the_filtered_softmax(temperature, top_k, top_p):
    vocab, draws = 8, 20000
    logits_row = random_logits(1, vocab, seed=7, scale=1.0)[0]
    expected = reference_distribution(logits_row, temperature, top_k, top_p)
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * draws
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        out = Sampler().sample(logits_row.expand(draws, vocab).contiguous(), params, [None] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=vocab).double()
    assert counts[expected == 0].sum() == 0
    assert chi_square_p_value(counts, expected) > 1e-3


def test_seeded_draws_follow_the_distribution_too():
    vocab, draws = 6, 5000
    logits_row = random_logits(1, vocab, seed=8, scale=1.0)[0]
    generator = make_generator(77)
    params = [SamplingParams(temperature=1.0, seed=77)] * draws
    # One generator shared by every row: each row takes the next `vocab` draws from it.
    out = Sampler().sample(logits_row.expand(draws, vocab).contiguous(), params, [generator] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=vocab).double()
    assert chi_square_p_value(counts, reference_distribution(logits_row, 1.0, 0, 1.0)) > 1e-3


def test_top_k_and_top_p_never_sample_outside_the_allowed_set():
    sampler = Sampler()
    rows, vocab = 64, 300
    params = [
        SamplingParams(temperature=1.8, top_k=4),
        SamplingParams(temperature=1.5, top_p=0.3),
        SamplingParams(temperature=2.0, top_k=10, top_p=0.5, seed=1),
        SamplingParams(temperature=1.0, top_k=2, top_p=0.99),
    ] * (rows // 4)
    generators = [make_generator(i) if i % 3 == 0 else None for i in range(rows)]
    for trial in range(10):
        logits = random_logits(rows, vocab, seed=100 + trial, scale=0.5)
        out = sampler.sample(logits, params, generators)
        for row, token in enumerate(out.token_ids):
            p = params[row]
            allowed = reference_distribution(logits[row], p.temperature, p.top_k, p.top_p) > 0
            assert allowed[token], f"row {row} sampled {token} outside its top-k/top-p set"


def test_logprobs_are_the_raw_log_softmax_and_top_logprobs_the_k_largest():
    vocab = 300
    logits = random_logits(5, vocab, seed=21)
    params = [
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(temperature=0.5, logprobs=3),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.7, top_k=20, logprobs=20),
        SamplingParams(temperature=1.0, top_p=0.4, logprobs=1, seed=4),
    ]
    out = Sampler().sample(logits, params, [make_generator(p.seed) for p in params])
    reference = torch.log_softmax(logits.double(), dim=-1)  # raw: no temperature, no filters

    assert out.logprobs[2] is None and out.top_logprobs[2] is None
    assert out.top_logprobs[0] == []
    for row in (0, 1, 3, 4):
        token = out.token_ids[row]
        assert out.logprobs[row] == pytest.approx(reference[row, token].item(), abs=1e-5)
        k = params[row].logprobs
        top = out.top_logprobs[row]
        assert len(top) == k
        ref_values, ref_ids = reference[row].topk(k) if k else (torch.empty(0), torch.empty(0))
        assert [t for t, _ in top] == ref_ids.tolist()
        assert [lp for _, lp in top] == pytest.approx(ref_values.tolist(), abs=1e-5)
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)


def test_logprobs_on_a_vocab_smaller_than_k():
    logits = random_logits(1, 5, seed=3)
    out = Sampler().sample(logits, [SamplingParams(temperature=0.0, logprobs=20)], [None])
    assert [t for t, _ in out.top_logprobs[0]] == logits[0].double().argsort(descending=True).tolist()


def test_no_logprobs_requested_returns_none_everywhere():
    logits = random_logits(3, 50, seed=4)
    params = [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(top_p=0.5)]
    out = Sampler().sample(logits, params, [None] * 3)
    assert out.logprobs == [None] * 3 and out.top_logprobs == [None] * 3


def test_bad_inputs_name_the_problem():
    sampler = Sampler()
    with pytest.raises(ValueError, match="float32"):
        sampler.sample(random_logits(2, 10, seed=0).half(), [SamplingParams()] * 2, [None] * 2)
    with pytest.raises(ValueError, match="one SamplingParams"):
        sampler.sample(random_logits(2, 10, seed=0), [SamplingParams()], [None])


def test_make_generator_without_seed_uses_the_global_rng():
    assert make_generator(None) is None
    a, b = make_generator(2**70 + 5), make_generator(2**70 + 5)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


def test_greedy_ties_pick_the_lowest_index_like_torch_argmax():
    logits = torch.zeros(4, 300)
    logits[0, [7, 3, 250]] = 2.0
    logits[1, [299, 298]] = 1.0
    logits[3] = torch.arange(300.0).flip(0)  # plain maximum at index 0
    out = Sampler().sample(logits, [SamplingParams(temperature=0.0)] * 4, [None] * 4)
    assert out.token_ids == logits.argmax(dim=-1).tolist() == [3, 298, 0, 0]


def test_filtered_rows_beyond_the_candidates_stay_inside_their_kept_set():
    """Vocabularies larger than the sampler's candidate window: nuclei that fit in it, flat rows whose
    nucleus does not (full-sort fallback), and a top-k larger than the window."""
    rows, vocab = 24, CANDIDATES * 4
    params = [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=CANDIDATES + 50),
        SamplingParams(temperature=1.3, top_k=30, top_p=0.7, seed=2),
    ] * (rows // 3)
    generators = [make_generator(p.seed) for p in params]
    for trial in range(4):
        # Alternate peaked rows (small nucleus) and nearly flat rows (nucleus past the window).
        scales = torch.tensor([4.0 if (row + trial) % 2 else 0.05 for row in range(rows)])[:, None]
        logits = random_logits(rows, vocab, seed=300 + trial, scale=1.0) * scales
        out = Sampler().sample(logits, params, generators)
        for row, token in enumerate(out.token_ids):
            p = params[row]
            allowed = reference_distribution(logits[row], p.temperature, p.top_k, p.top_p) > 0
            assert allowed[token], f"row {row} sampled {token} outside its top-k/top-p set"


@pytest.mark.parametrize("flat", [False, True])
def test_nucleus_frequencies_past_the_candidate_window(flat):
    """The candidate path (peaked row) and the full-sort fallback (flat row) draw from the same distribution."""
    vocab, draws = CANDIDATES + 200, 3000
    logits_row = random_logits(1, vocab, seed=9, scale=1.0)[0] * (0.02 if flat else 1.0)
    if not flat:
        logits_row[:5] += torch.tensor([9.0, 8.5, 8.0, 7.0, 6.0])  # most of the mass in five tokens
    top_p = 0.97 if flat else 0.8
    expected = reference_distribution(logits_row, 1.0, 0, top_p)
    params = [SamplingParams(temperature=1.0, top_p=top_p)] * draws
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12)
        out = Sampler().sample(logits_row.expand(draws, vocab).contiguous(), params, [None] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=vocab).double()
    assert counts[expected == 0].sum() == 0
    if flat:  # too many tokens for 3000 draws to test frequencies, but the nucleus reaches past the window
        beyond_window = logits_row.argsort(descending=True)[CANDIDATES:]
        assert counts[beyond_window].sum() > 0, "the flat nucleus was cut at the candidate window"
    else:
        assert chi_square_p_value(counts, expected) > 1e-3


def test_top_k_keeps_every_token_tied_with_the_kth_even_past_the_candidates():
    vocab = CANDIDATES * 2
    logits = torch.zeros(2, vocab)
    logits[0, :3] = torch.tensor([5.0, 4.0, 3.0])  # k=2 keeps {0, 1}; value 3 is below the 2nd
    logits[1, 10] = 1.0  # k=2: the 2nd largest is 0.0, shared by every other token
    draws = 2000
    batch = logits.repeat_interleave(draws, dim=0)  # [2 * draws, vocab]: row 0's copies, then row 1's
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        out = Sampler().sample(batch, [SamplingParams(temperature=1.0, top_k=2)] * (2 * draws), [None] * (2 * draws))
    assert set(out.token_ids[:draws]) == {0, 1}
    # About vocab - 1 equally likely tokens: 2000 draws see far more of them than the window holds.
    assert len(set(out.token_ids[draws:])) > CANDIDATES, "tied tokens past the candidate window were dropped"


# ------------------------------------------------- logit adjustments (penalties, logit_bias, min_tokens)

@dataclass
class History:
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def reference_adjusted(logits_row: torch.Tensor, p: SamplingParams, history: History,
                       eos_token_ids: tuple[int, ...]) -> torch.Tensor:
    """One row adjusted token by token in fp64, from the definitions in vLLM's and OpenAI's documentation."""
    row = logits_row.double().clone()
    for token in set(history.prompt_token_ids) | set(history.output_token_ids):
        row[token] = row[token] / p.repetition_penalty if row[token] > 0 else row[token] * p.repetition_penalty
    for token in set(history.output_token_ids):
        count = history.output_token_ids.count(token)
        row[token] -= p.frequency_penalty * count + p.presence_penalty
    for token, bias in p.logit_bias.items():
        row[token] += bias
    if len(history.output_token_ids) < p.min_tokens:
        for token in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids)):
            row[token] = float("-inf")
    return row


EOS = (3,)
ADJUSTING = [
    SamplingParams(temperature=0.0, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, repetition_penalty=0.7),
    SamplingParams(temperature=0.0, frequency_penalty=1.5),
    SamplingParams(temperature=0.0, presence_penalty=-0.8),
    SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=-1.0, repetition_penalty=1.2),
    SamplingParams(temperature=0.0, logit_bias={5: -100, 7: 3.5, 11: 100}),
    SamplingParams(temperature=0.0, min_tokens=6, stop_token_ids=[9]),
    SamplingParams(temperature=0.0, min_tokens=6, ignore_eos=True, stop_token_ids=[9]),
    SamplingParams(temperature=0.0, min_tokens=2, logit_bias={3: 50}),  # already past min_tokens: eos allowed
]


def adjusting_batch(seed: int) -> tuple[torch.Tensor, list[SamplingParams], list[History]]:
    """ADJUSTING interleaved with plain greedy rows, over a small vocabulary so that histories repeat tokens."""
    vocab = 40
    generator = torch.Generator().manual_seed(seed)
    params, histories = [], []
    for p in ADJUSTING:
        prompt = torch.randint(0, vocab, (12,), generator=generator).tolist()
        output = torch.randint(0, vocab, (4,), generator=generator).tolist()
        params += [p, SamplingParams(temperature=0.0)]
        histories += [History(prompt, output), History(prompt, output)]
    return random_logits(len(params), vocab, seed=seed), params, histories


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adjusted_rows_choose_by_their_definition_and_plain_rows_are_untouched(seed):
    logits, params, histories = adjusting_batch(seed)
    raw = logits.clone()
    out = Sampler(EOS).sample(logits, params, [None] * len(params), histories)
    for row, (p, history) in enumerate(zip(params, histories)):
        expected = reference_adjusted(raw[row], p, history, EOS)
        assert logits[row].double() == pytest.approx(expected, abs=1e-4), (row, p)
        assert out.token_ids[row] == int(expected.argmax()), (row, p)
        if not p.adjusts_logits:
            assert torch.equal(logits[row], raw[row])


def test_min_tokens_masks_eos_and_stop_tokens_only_until_reached():
    logits = torch.zeros(1, 20)
    logits[0, [3, 9]] = torch.tensor([5.0, 4.0])  # eos first, then the stop token
    logits[0, 12] = 1.0
    p = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[9])

    def choose(num_output: int) -> int:
        return Sampler(EOS).sample(logits.clone(), [p], [None], [History([1], [0] * num_output)]).token_ids[0]

    assert [choose(n) for n in range(5)] == [12, 12, 12, 3, 3]


def test_logprobs_of_adjusted_rows_stay_raw():
    logits, params, histories = adjusting_batch(seed=5)
    params = [dataclasses.replace(p, logprobs=2) for p in params]
    reference = torch.log_softmax(logits.double(), dim=-1)
    out = Sampler(EOS).sample(logits, params, [None] * len(params), histories)
    for row, token in enumerate(out.token_ids):
        assert out.logprobs[row] == pytest.approx(reference[row, token].item(), abs=1e-5)
        assert [t for t, _ in out.top_logprobs[row]] == reference[row].topk(2).indices.tolist()


def test_sampled_frequencies_follow_the_penalized_distribution():
    vocab, draws = 8, 20000
    logits_row = random_logits(1, vocab, seed=13, scale=1.0)[0]
    p = SamplingParams(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.4, repetition_penalty=1.3,
                       logit_bias={6: 1.0})
    history = History([0, 1, 2, 2], [2, 5, 5, 5])
    expected = torch.softmax(reference_adjusted(logits_row, p, history, EOS) / p.temperature, dim=-1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(14)
        out = Sampler(EOS).sample(logits_row.expand(draws, vocab).contiguous(), [p] * draws, [None] * draws,
                                  [history] * draws)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=vocab).double()
    assert chi_square_p_value(counts, expected) > 1e-3
    # The penalties move real mass: the unpenalized distribution is refused.
    assert chi_square_p_value(counts, reference_distribution(logits_row, p.temperature, 0, 1.0)) < 1e-6


def test_adjusting_rows_need_their_histories():
    with pytest.raises(ValueError, match="histories"):
        Sampler().sample(random_logits(1, 10, seed=0), [SamplingParams(presence_penalty=1.0)], [None])
