"""OutputProcessor on its own: what a step's sampled tokens become, which requests end and why, and
the counters it keeps. Token ids only (no tokenizer): the text paths run through the whole engine in
test_llm_engine.py."""
from __future__ import annotations

from loraloom.engine.output_processor import EndedRequest, OutputProcessor
from loraloom.engine.request import Request, SamplingParams
from loraloom.engine.sampler import SamplerOutput
from loraloom.engine.speculation.verify import StepTokens

EOS = 2


def admitted(processor: OutputProcessor, request_id: str, max_tokens: int,
             stop_token_ids: tuple[int, ...] = ()) -> Request:
    request = Request(request_id, [5, 6, 7], SamplingParams(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids)))
    processor.add_request(request)
    return request


def sample(processor: OutputProcessor, requests: list[Request], tokens: list[int],
           failed_rows: frozenset[int] = frozenset()):
    """One step: append the tokens as the scheduler does, then process them."""
    for request, token in zip(requests, tokens):
        request.output_token_ids.append(token)
    sampled = SamplerOutput(token_ids=tokens, logprobs=[None] * len(tokens), top_logprobs=[None] * len(tokens))
    return processor.process(requests, StepTokens.one_each(sampled), set(failed_rows))


def test_requests_end_by_length_and_by_stop_token_and_the_others_go_on():
    processor = OutputProcessor(tokenizer=None, eos_token_ids=[EOS], metrics_max_adapters=4)
    short = admitted(processor, "short", 1)
    stopper = admitted(processor, "stopper", 5, stop_token_ids=(9,))
    long = admitted(processor, "long", 5)
    outputs, ended = sample(processor, [short, stopper, long], [11, 9, 12])
    assert [(o.request_id, o.token_ids, o.finished, o.finish_reason) for o in outputs] == [
        ("short", [11], True, "length"), ("stopper", [9], True, "stop"), ("long", [12], False, None)]
    assert all(o.text_delta == "" for o in outputs)  # no tokenizer: token ids only
    assert ended == [EndedRequest(short, "length"), EndedRequest(stopper, "stop")]
    outputs, ended = sample(processor, [long], [EOS])
    assert (outputs[0].finish_reason, outputs[0].num_output_tokens, ended) == ("stop", 2, [EndedRequest(long, "stop")])
    assert processor.finished_requests == {("", "base", "length"): 1, ("", "base", "stop"): 2}
    assert processor.requests_per_adapter == {("", "base"): 3}


def test_a_failed_row_ends_its_request_alone_without_its_token():
    processor = OutputProcessor(tokenizer=None, eos_token_ids=[EOS], metrics_max_adapters=4)
    broken, fine = admitted(processor, "broken", 5), admitted(processor, "fine", 5)
    outputs, ended = sample(processor, [broken, fine], [11, 12], failed_rows=frozenset({0}))
    failed = outputs[0]
    assert (failed.token_ids, failed.finished, failed.finish_reason, failed.num_output_tokens) == ([], True, "error", 0)
    assert "non-finite values" in failed.error and "the base model" in failed.error
    assert (outputs[1].token_ids, outputs[1].finished) == ([12], False)
    assert ended == [EndedRequest(broken, "error")]
    assert processor.finished_requests == {("", "base", "error"): 1}


def test_an_abort_is_counted_once_and_only_for_a_tracked_request():
    processor = OutputProcessor(tokenizer=None, eos_token_ids=[EOS], metrics_max_adapters=4)
    admitted(processor, "gone", 5)
    assert processor.abort_request("gone") is True
    assert processor.abort_request("gone") is False  # already forgotten
    assert processor.abort_request("never-added") is False
    assert processor.finished_requests == {("", "base", "abort"): 1}
