"""Structured output in the sampler: rows with a grammar produce JSON valid for their schema, whatever
the logits say; rows without one are left exactly as they were."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.sampler import Sampler, make_generator
from loraloom.engine.stop import GrammarTokenStops
from loraloom.engine.structured_output import GrammarCompiler
from loraloom.engine.tokenizer import Tokenizer

# Small and bounded, so that even random logits finish the JSON within a few dozen tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["color", "count", "ok", "tags"],
    "additionalProperties": False,
}
MAX_STEPS = 400


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.to_json(), tokenizer.vocab_size, tokenizer.eos_token_ids)


def test_masked_rows_produce_valid_json_and_plain_rows_are_untouched(compiler, tokenizer):
    schema_grammar, object_grammar = compiler.compile(SCHEMA), compiler.compile(None)
    params = [SamplingParams(max_tokens=MAX_STEPS, **fields) for fields in (
        dict(temperature=0.0, grammar=schema_grammar),
        dict(temperature=0.0),
        dict(temperature=1.0, seed=7, grammar=schema_grammar),
        dict(temperature=0.8, top_k=20, seed=3),
        # Any JSON object: under random logits its keys and strings would run on, so the tokens
        # that close them are favoured (a bias, which the mask then overrides where they do not fit).
        dict(temperature=1.0, seed=11, grammar=object_grammar, logit_bias={
            token: 12.0 for text in ('"', '}', '"}', '":', '",') for token in tokenizer.encode(text, False)}),
        dict(temperature=0.0, presence_penalty=1.0),
    )]
    requests = [Request(f"r{row}", [1, 2, 3], p) for row, p in enumerate(params)]
    for request in requests:
        if request.sampling_params.grammar is not None:
            request.grammar = request.sampling_params.grammar.matcher()
    stops = [GrammarTokenStops(r.sampling_params, tokenizer.eos_token_ids, r.grammar) for r in requests
             if r.grammar is not None]
    constrained = [row for row, r in enumerate(requests) if r.grammar is not None]
    plain = [row for row in range(len(requests)) if row not in constrained]
    sampler = Sampler(tokenizer.eos_token_ids)
    generators = [make_generator(p.seed) for p in params]
    solo_generators = {row: make_generator(params[row].seed) for row in plain}
    vocab = tokenizer.vocab_size
    logit_stream = torch.Generator().manual_seed(0)
    finished = [False] * len(requests)
    reasons: dict[int, str | None] = {}
    for step in range(MAX_STEPS):
        live = [row for row in range(len(requests)) if not finished[row]]
        if not any(row in constrained for row in live):
            break
        logits = torch.randn(len(live), vocab, generator=logit_stream) * 4
        raw = logits.clone()
        out = sampler.sample(logits, [params[row] for row in live], [generators[row] for row in live],
                             [requests[row] for row in live])
        for position, row in enumerate(live):
            token = out.token_ids[position]
            if row in plain:
                # Unconstrained rows: their logits untouched, their token the one they draw alone.
                assert torch.equal(logits[position], raw[position]) or params[row].adjusts_logits
                solo = sampler.sample(raw[position:position + 1].clone(), [params[row]], [solo_generators[row]],
                                      [requests[row]])
                assert token == solo.token_ids[0], (step, row)
            else:
                reasons[row] = stops[constrained.index(row)].check(token, len(requests[row].output_token_ids) + 1)
                finished[row] = reasons[row] is not None
            requests[row].output_token_ids.append(token)
    for row in constrained:
        assert reasons[row] == "stop", f"row {row} did not finish its JSON in {MAX_STEPS} tokens"
        text = tokenizer.decode(requests[row].output_token_ids)
        value = json.loads(text)
        assert isinstance(value, dict), text
        if params[row].grammar is schema_grammar:
            jsonschema.validate(value, SCHEMA)


def test_compile_cache_and_refusals(compiler):
    assert compiler.compile(SCHEMA) is compiler.compile(json.loads(json.dumps(SCHEMA)))
    for bad in ({"type": "objekt"}, {"type": "string", "pattern": "(("}, {"$ref": "#/nowhere"},
                {"type": "object", "properties": {"p": {"type": "string", "maxLength": 10 ** 40}}}):
        with pytest.raises(ValueError, match="^response_format: "):
            compiler.compile(bad)
    # A cycle of bare references: llguidance's own text ("NoExtensionBias <non-verbose/>") says nothing to a client.
    with pytest.raises(ValueError, match=r"^response_format: .* \$ref definitions refer to one another in a cycle"):
        compiler.compile({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    with pytest.raises(ValueError, match="^response_format: .* bytes"):
        compiler.compile({"enum": ["x" * 40_000]})
