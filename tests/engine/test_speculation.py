"""Speculative decoding on the bundled model: drafts verified in one forward must leave every output as
decoding one token per step makes it, in each sampling mode, with adapters, and in mixed batches."""
from __future__ import annotations

import pytest

from lora_factory import make_peft_adapter
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.speculation.ngram_index import NgramIndex
from loraloom.engine.speculation.speculator import MATCH_CONTEXT, Speculator, _Drafting
from loraloom.engine.speculation.step_cost import DEFAULT_ROW_SHARE, StepCost
from loraloom.engine.tenancy import TenantTag

PASSAGE = ("The quarterly report lists three risks: supplier delays in the northern region, a rising cost of "
           "copper wire, and the retirement of two senior engineers who maintain the billing system.")
COPY = f"Repeat the following text exactly, word for word:\n{PASSAGE}"
EDIT = f"Rewrite this text with every number spelled in digits, keeping the rest unchanged:\n{PASSAGE}"
OPEN = ["Write a short poem about the sea.", "Why do cats purr?", "Give me three ideas for a birthday party."]


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("speculation_adapters")
    handles = []
    for index, (rank, modules) in enumerate([(8, ["q_proj", "v_proj"]), (4, ["o_proj", "down_proj", "up_proj"])]):
        path = make_peft_adapter(model_dir, root / f"s{index}", rank=rank, alpha=2 * rank, target_modules=modules,
                                 seed=700 + index)
        handles.append(AdapterHandle(key=f"s{index}@test", name=f"s{index}", uri=path.as_uri()))
    return handles


@pytest.fixture(scope="module")
def engines(model_dir):
    """(decoding one token a step, speculating): one engine of each, shared by the module's tests."""
    config = dict(num_kv_blocks=512, max_loras=2)
    return (LLMEngine(model_dir, EngineConfig(speculation="off", **config)),
            LLMEngine(model_dir, EngineConfig(speculation="auto", **config)))


def prompt(engine: LLMEngine, text: str) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "user", "content": text}])


def generate(engine: LLMEngine, requests, params: SamplingParams, tenant: TenantTag | None = None):
    """requests: (request_id, text, adapter or None). The outputs of each, in order, once all have finished."""
    extra = {} if tenant is None else {"tenant": tenant}
    for request_id, text, adapter in requests:
        engine.add_request(request_id, prompt(engine, text), params, adapter, **extra)
    outputs = {request_id: [] for request_id, _, _ in requests}
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id].append(output)
    return outputs


def tokens(outputs) -> dict[str, list[int]]:
    return {request_id: [token for output in stream for token in output.token_ids] for request_id, stream in outputs.items()}


def counters(engine: LLMEngine) -> tuple[int, int, int]:
    speculator = engine.speculator
    return (sum(speculator.drafts.values()), sum(speculator.draft_tokens.values()),
            sum(speculator.accepted_tokens.values()))


def test_greedy_outputs_are_identical_and_copying_takes_fewer_steps(engines, adapters):
    plain, speculating = engines
    requests = [("copy", COPY, None), ("edit", EDIT, adapters[0]), ("open0", OPEN[0], adapters[1]),
                ("open1", OPEN[1], None)]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    drafts_before, drafted_before, accepted_before = counters(speculating)
    expected = tokens(generate(plain, [(f"p-{i}", t, a) for i, t, a in requests], params))
    got = tokens(generate(speculating, [(f"s-{i}", t, a) for i, t, a in requests], params))
    assert {key[2:]: value for key, value in got.items()} == {key[2:]: value for key, value in expected.items()}
    drafts, drafted, accepted = counters(speculating)
    assert accepted - accepted_before >= 20, "copying a passage accepted almost nothing: nothing was verified"
    assert 0 < accepted - accepted_before < drafted - drafted_before, "no draft was rejected: rollback untested"
    assert drafts > drafts_before


def test_sampled_outputs_with_a_seed_are_identical(engines, adapters):
    plain, speculating = engines
    params = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=1234)
    requests = [("copy", COPY, adapters[0]), ("open", OPEN[2], None)]
    expected = tokens(generate(plain, [(f"p-{i}", t, a) for i, t, a in requests], params))
    got = tokens(generate(speculating, [(f"s-{i}", t, a) for i, t, a in requests], params))
    assert got["s-copy"] == expected["p-copy"] and got["s-open"] == expected["p-open"]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0, frequency_penalty=0.4, presence_penalty=0.3),
    SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.15, logit_bias={13: -5.0}),
    SamplingParams(max_tokens=30, temperature=0.0, min_tokens=25, logprobs=3),
    SamplingParams(max_tokens=40, temperature=0.0, stop=["copper"]),
    SamplingParams(max_tokens=17, temperature=0.0),
], ids=["penalties", "repetition-and-bias", "min-tokens-and-logprobs", "stop-string", "max-tokens"])
def test_adjustments_logprobs_stops_and_lengths_compose(engines, params):
    plain, speculating = engines
    expected = generate(plain, [("p", COPY, None)], params)["p"]
    got = generate(speculating, [("s", COPY, None)], params)["s"]
    assert [output.token_ids for output in got] == [output.token_ids for output in expected]
    assert "".join(output.text_delta for output in got) == "".join(output.text_delta for output in expected)
    assert [output.finish_reason for output in got] == [output.finish_reason for output in expected]
    if params.logprobs is not None:
        for mine, theirs in zip(got, expected):
            assert [token for token, _, _ in mine.logprobs[0].top] == [token for token, _, _ in theirs.logprobs[0].top]
            assert mine.logprobs[0].logprob == pytest.approx(theirs.logprobs[0].logprob, abs=1e-3)


def test_structured_output_is_identical_and_its_grammar_rolls_back(engines):
    plain, speculating = engines
    schema = {"type": "object", "properties": {"risks": {"type": "array", "items": {"type": "string"}}},
              "required": ["risks"]}
    text = f"List the risks in this report as JSON with a 'risks' array of short strings:\n{PASSAGE}"

    def run(engine, request_id):
        params = SamplingParams(max_tokens=60, temperature=0.0, grammar=engine.compile_grammar(schema))
        return generate(engine, [(request_id, text, None)], params)[request_id]

    expected, got = run(plain, "p-json"), run(speculating, "s-json")
    assert [output.token_ids for output in got] == [output.token_ids for output in expected]
    assert got[-1].finish_reason == expected[-1].finish_reason


def test_a_tenants_answers_never_draft_for_another_tenant(engines):
    _, speculating = engines
    speculating.speculator.store.clear()
    params = SamplingParams(max_tokens=24, temperature=0.0)
    owner, other = TenantTag("t-owner", "owner"), TenantTag("t-other", "other")
    generate(speculating, [("owner-1", OPEN[1], None)], params, tenant=owner)
    stored = speculating.speculator.store.stats()
    assert stored.tokens > 0 and stored.scopes == 1
    # The same question from the other tenant: only its own prompt may draft; the owner again: the answer may.
    before = dict(speculating.speculator.accepted_tokens)
    generate(speculating, [("other-1", OPEN[1], None)], params, tenant=other)
    generate(speculating, [("owner-2", OPEN[1], None)], params, tenant=owner)
    after = speculating.speculator.accepted_tokens
    gained = {labels: after[labels] - before.get(labels, 0) for labels in after}
    assert gained.get(("owner", "base"), 0) >= 15, gained
    assert gained.get(("other", "base"), 0) < gained[("owner", "base")] // 2, gained


def test_drafts_are_as_long_as_their_chance_pays_and_pause_longer_each_time_it_does_not():
    speculator = Speculator(max_tokens=6, max_model_len=1024, labels=lambda request: ("t", "base"))
    request = Request("r", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2], SamplingParams(max_tokens=100))
    state = _Drafting(NgramIndex(max_n=MATCH_CONTEXT))
    state.index.extend(request.prompt_token_ids)
    # Chance 1/2 at a price of 0.1: tokens up to 0.5**3 > 0.1 are worth a row.
    assert speculator._propose(request, state, price=0.1) == [3, 4, 5]
    for _ in range(4):
        speculator._count(request, state, proposed=3, accepted=3)
    assert state.chance > 0.9 and speculator._propose(request, state, price=0.1) == [3, 4, 5, 6, 7, 1]
    # The same chance does not pay where rows are most of the step.
    pauses = []
    for _ in range(2):
        while speculator._propose(request, state, price=0.5):
            speculator._count(request, state, proposed=1, accepted=0)
        pauses.append(state.paused_until - speculator._steps)
        assert speculator._propose(request, state, price=0.1) == []  # paused, whatever the price
        speculator._steps = state.paused_until
    assert pauses[1] == 2 * pauses[0]
    assert speculator._propose(request, state, price=0.1) == [3, 4, 5], "after a pause it tries again"


def test_a_steps_row_cost_is_fitted_from_its_steps():
    cost = StepCost()
    assert cost.row_share(8) == DEFAULT_ROW_SHARE
    for step in range(200):  # 20 ms to read the weights, 2 ms per row
        rows = 1 + step % 9
        cost.observe(rows, 0.020 + 0.002 * rows)
    assert cost.row_share(1) == pytest.approx(0.002 / 0.022)
    assert cost.row_share(8) == pytest.approx(0.016 / 0.036)
