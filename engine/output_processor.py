"""OutputProcessor: what a step's sampled tokens become for the callers.

For each sampled token it builds the request's RequestOutput (text, logprobs, finish reason),
decides whether the request ends (eos, stop token, length, stop string, a complete grammar, or
logits that were not finite), and feeds the request's latency histograms and finish counters.
It keeps the per-request state the scheduler does not need, from admission (`add_request`)
until the request ends; the engine frees what an ended request holds (its KV blocks and slot in
the scheduler, its adapter's host-cache hold, its random stream).

Text is produced where it is needed: a request with stop strings is detokenized in the step (its
stop check reads the text); any other request's outputs carry a DeferredDetokenizer and are
detokenized when their text_delta is first read, off the step loop (by AsyncEngine's consumers).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

from loraloom.engine.detokenizer import DeferredDetokenizer, IncrementalDetokenizer
from loraloom.engine.metric_labels import MetricLabels
from loraloom.engine.outputs import RequestOutput, TokenLogprob
from loraloom.engine.request import Request
from loraloom.engine.request_latency import LatencyHistogram, LatencySeries, RequestLatencies
from loraloom.engine.speculation.verify import StepTokens, TopLogprobs
from loraloom.engine.stop import GrammarTokenStops, StopStringMatcher, TokenStops
from loraloom.engine.tokenizer import Tokenizer


@dataclass(slots=True)
class RequestState:
    """Per-request state the scheduler does not need: text, stops and metrics.

    Without a tokenizer all three text fields are None and outputs carry token ids only.
    """

    request: Request
    token_stops: TokenStops
    stops: StopStringMatcher | None  # None: no stop strings
    detokenizer: IncrementalDetokenizer | None  # text made in the step: requests with stop strings
    deferred: DeferredDetokenizer | None  # text made when read: requests without stop strings
    arrival_time: float  # time.monotonic() when the request reached the engine (AsyncEngine.generate)
    labels: tuple[str, str]  # (tenant, model) its metrics count under, past the adapter cap folded (metric_labels.py)
    latency: LatencySeries  # the histograms of `labels`
    last_token_time: float | None = None  # when its latest token was sampled; None before the first


class EndedRequest(NamedTuple):
    """A request that ended in a step: the engine frees what it holds."""

    request: Request
    finish_reason: str  # "stop" | "length" (RequestStatus values), or "error": its logits were not finite


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, eos_token_ids: Collection[int], metrics_max_adapters: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self._states: dict[str, RequestState] = {}
        self.latencies = RequestLatencies()
        self.metric_labels = MetricLabels(metrics_max_adapters)
        self.requests_per_adapter: Counter[tuple[str, str]] = Counter()  # (tenant, model) labels
        self.finished_requests: Counter[tuple[str, str, str]] = Counter()  # (tenant, model, finish reason)

    def add_request(self, request: Request, arrival_time: float | None = None) -> None:
        """Track an admitted request. `arrival_time` (time.monotonic()): when it reached the engine, if
        before now; its latency metrics count from there."""
        params = request.sampling_params
        detokenizer = None if self.tokenizer is None else IncrementalDetokenizer(self.tokenizer,
                                                                                  request.prompt_token_ids)
        eager = bool(params.stop)
        labels = self.metric_labels.of(*request.metrics_labels)
        self._states[request.request_id] = RequestState(
            request=request,
            token_stops=(TokenStops(params, self.eos_token_ids) if request.grammar is None
                         else GrammarTokenStops(params, self.eos_token_ids, request.grammar)),
            stops=StopStringMatcher(params.stop) if eager else None,
            detokenizer=detokenizer if eager else None,
            deferred=None if eager or detokenizer is None else DeferredDetokenizer(detokenizer,
                                                                                  request.output_token_ids),
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            labels=labels,
            latency=self.latencies.series(labels),
        )
        self.requests_per_adapter[labels] += 1

    def abort_request(self, request_id: str) -> bool:
        """Forget an aborted request and count its end; False if it was not tracked (unknown or ended)."""
        state = self._states.pop(request_id, None)
        if state is None:
            return False
        self.finished_requests[(*state.labels, "abort")] += 1
        return True

    def process(self, requests: list[Request], sampled: StepTokens | None,
                failed: set[int]) -> tuple[list[RequestOutput], list[EndedRequest]]:
        """Each request's outputs for its newly sampled tokens (one output per token: a request that verified
        a draft has several), and the requests that ended; those whose logits were not finite (`failed`,
        indices into `requests`) fail without their token. A request that ends before its step's last
        token (a stop token or string among accepted proposals) drops the tokens after it.

        The loop runs once per running request per step, so the common case (no stop strings, no
        logprobs) is a set lookup and one RequestOutput, its text left for whoever reads it.
        Every token of a step was sampled at once: one clock reading times them all, and the step's
        inter-token gaps enter their histogram under one lock.
        """
        outputs = []
        ended: list[EndedRequest] = []
        states = self._states
        now = time.monotonic()
        gaps: dict[LatencyHistogram, list[float]] = {}  # each label pair's gaps, observed under one lock
        for index, request in enumerate(requests):
            if index in failed:
                outputs.append(self._fail(request))
                ended.append(EndedRequest(request, "error"))
                continue
            state = states[request.request_id]
            tokens = sampled.token_ids[index]
            if state.last_token_time is None:
                state.latency.time_to_first_token.observe(now - state.arrival_time)
            else:  # tokens that arrive together share the wait: each one's gap is its part of it
                gap = (now - state.last_token_time) / len(tokens)
                gaps.setdefault(state.latency.inter_token_latency, []).extend([gap] * len(tokens))
            state.last_token_time = now
            first = len(request.output_token_ids) - len(tokens) + 1  # the output number of tokens[0]
            for offset, token in enumerate(tokens):
                num_output_tokens = first + offset
                finish_reason = state.token_stops.check(token, num_output_tokens)
                if state.stops is not None:
                    text, finish_reason = self._text_until_stop(state, token, finish_reason)
                else:
                    text = None if state.deferred is not None else ""  # "": no tokenizer, token ids only
                logprobs = None
                if request.sampling_params.logprobs is not None:
                    logprobs = self._logprobs(token, sampled.logprobs[index][offset],
                                              sampled.top_logprobs[index][offset])
                outputs.append(RequestOutput(request.request_id, [token], logprobs, finish_reason is not None,
                                             finish_reason, len(request.prompt_token_ids), num_output_tokens,
                                             request.num_cached_tokens, text, state.deferred))
                if finish_reason is not None:
                    del request.output_token_ids[num_output_tokens:]  # accepted proposals past the end
                    state.latency.e2e_request_latency.observe(now - state.arrival_time)
                    self.finished_requests[(*state.labels, finish_reason)] += 1
                    del states[request.request_id]
                    ended.append(EndedRequest(request, finish_reason))
                    break
        for histogram, values in gaps.items():
            histogram.observe_all(values)
        return outputs, ended

    @staticmethod
    def _text_until_stop(state: RequestState, token: int, finish_reason: str | None) -> tuple[str, str | None]:
        """The text `token` adds for a request with stop strings, cut at a stop string, and the finish reason."""
        text = state.detokenizer.step(token)
        if finish_reason is not None:
            text += state.detokenizer.flush()
        text, hit_stop_string = state.stops.feed(text)
        if hit_stop_string:
            return text, "stop"
        if finish_reason is not None:
            text += state.stops.flush()
        return text, finish_reason

    def _fail(self, request: Request) -> RequestOutput:
        """The last output of a request whose logits held NaN or Inf (the step goes on for the others)."""
        adapter = "the base model" if request.adapter is None else f"adapter {request.adapter.name!r}"
        message = (f"generation failed: {adapter} produced non-finite values (NaN or infinity) for this request; "
                   "if it is an adapter, check its weights and lora_alpha")
        num_output_tokens = len(request.output_token_ids) - 1  # the token sampled from broken logits is dropped
        state = self._states.pop(request.request_id)
        # A failed request ended, as far as its client sees: its end-to-end latency counts (aborts' do not).
        state.latency.e2e_request_latency.observe(time.monotonic() - state.arrival_time)
        self.finished_requests[(*state.labels, "error")] += 1
        return RequestOutput(request.request_id, [], None, True, "error", len(request.prompt_token_ids),
                             max(num_output_tokens, 0), request.num_cached_tokens, "", None, message)

    def _logprobs(self, token: int, logprob: float, top: TopLogprobs) -> list[TokenLogprob]:
        top = top or []
        return [TokenLogprob(
            token_id=token,
            token=self.tokenizer.decode([token], skip_special_tokens=False),
            logprob=logprob,
            top=[(tid, self.tokenizer.decode([tid], skip_special_tokens=False), lp) for tid, lp in top],
        )]
