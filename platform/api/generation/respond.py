"""A generation from the route's plan to its answer: admitted by the rate limits, its grammar
compiled, started in the engine, guarded against the key's revocation and the client leaving, and
answered whole or as server-sent events.

The route makes a GenerationPlan, `start_generation`s it, and hands `Generation.answer` its two ways
of answering: the server-sent events it makes of the outputs, and the whole answer it makes of the
collected choices.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request, Response

from loraloom.engine import AdapterLoadError, EngineClient, RequestFieldError, SamplingParams
from loraloom.platform.api.errors import APIError, field_error
from loraloom.platform.api.generation.adapters import ResolvedAdapter
from loraloom.platform.api.generation.choices import ChoiceOutput, open_generation
from loraloom.platform.api.generation.collect import Collected, collect
from loraloom.platform.api.generation.sampling import choice_params, compile_grammar, default_max_tokens, sampling_params
from loraloom.platform.api.generation.streaming import CLIENT_CLOSED_REQUEST, cancel_on_disconnect, stream_response
from loraloom.platform.api.revocation import Revocation, revocable
from loraloom.platform.api.schemas.generation import GenerationRequest
from loraloom.platform.api.schemas.ignored_fields import IGNORED_FIELDS_HEADER, ignored_field_names
from loraloom.platform.api.sse import ending_in_error_event, opened_within
from loraloom.platform.metering.usage import UsageMeter

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class GenerationPlan:
    """What a route settled about one request before it reaches the engine."""

    body: GenerationRequest
    id_prefix: str  # of the response's id: "chatcmpl", "cmpl"
    prompt_token_ids: list[int]
    adapter: ResolvedAdapter
    max_tokens: int | None  # None: what the context leaves after the prompt (sampling.default_max_tokens)
    logprobs: int | None  # the engine's: None for none, else how many alternatives (0: the sampled token's only)
    tool_grammar: str | None = None  # the Lark grammar of constrained tool calls


@dataclass(frozen=True)
class ResponseHead:
    """What the response and each of its chunks carry: OpenAI's id, created (Unix seconds) and model (the
    request's, or the version that served an alias: generation/adapters.py)."""

    id: str
    created: int
    model: str
    num_choices: int = 1


async def start_generation(request: Request, engine: EngineClient, plan: GenerationPlan, meter: UsageMeter) -> Generation:
    """Admit the request (rate limits and quota: charged at most its prompt and every token it may
    generate, trued up when its meter finishes) and compile its grammar; the engine has not seen it yet."""
    body = plan.body
    max_tokens = plan.max_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens(len(plan.prompt_token_ids), engine.max_model_len, engine.generation_defaults)
    rate_limits = request.app.state.rate_limits
    ticket = await rate_limits.admit(request, engine, meter, tokens=len(plan.prompt_token_ids) + max_tokens * body.n)
    try:
        grammar = await compile_grammar(engine, body, plan.tool_grammar)
    except BaseException:
        rate_limits.release(ticket)  # refused before it reached the engine
        raise
    params = sampling_params(body, max_tokens=max_tokens, logprobs=plan.logprobs, defaults=engine.generation_defaults,
                             grammar=grammar)
    head = ResponseHead(id=f"{plan.id_prefix}-{uuid.uuid4().hex}", created=int(time.time()),
                        model=plan.adapter.response_model, num_choices=body.n)
    # Revoking the key (or its expiry) ends the generation, from its queueing to its last token.
    revocation = request.app.state.key_watch.watch(meter.caller.api_key_id)
    return Generation(request, engine, plan, meter, head, choice_params(params, body.n), revocation)


class Generation:
    """One admitted generation, answered once: `collect()` or `stream(...)`. A client that leaves before
    its answer begins streaming cancels it (Starlette handles a stream's client leaving after that)."""

    def __init__(self, request: Request, engine: EngineClient, plan: GenerationPlan, meter: UsageMeter,
                 head: ResponseHead, params: list[SamplingParams], revocation: Revocation) -> None:
        self.head = head
        self._request = request
        self._engine = engine
        self._plan = plan
        self._meter = meter
        self._params = params
        self._revocation = revocation
        self._opened: asyncio.Future[AsyncGenerator[ChoiceOutput, None] | None] | None = None  # set by stream()

    async def _open(self) -> AsyncGenerator[ChoiceOutput, None]:
        """The engine's outputs once choice 0 has its first (choices.open_generation); what the engine
        refuses is a 400 naming the request's field."""
        plan = self._plan
        try:
            return await self._revocation.guard(open_generation(
                self._engine, request_id=self.head.id, prompt_token_ids=plan.prompt_token_ids, params=self._params,
                adapter=plan.adapter.named, model=plan.body.model, meter=self._meter,
                cache_salt=plan.body.engine_cache_salt(),
            ))
        except RequestFieldError as error:
            raise field_error(error, plan.body.request_field) from None
        except AdapterLoadError as error:
            raise APIError(400, str(error), param=plan.adapter.field) from None

    async def collect(self) -> list[Collected] | None:
        """Every choice's whole generation; None if the client left first."""
        outputs = await cancel_on_disconnect(self._request, self._open)
        if outputs is None:
            return None
        return await cancel_on_disconnect(
            self._request, lambda: collect(revocable(outputs, self._revocation), self.head.num_choices)
        )

    async def stream(self, events: AsyncIterator[str]) -> Response:
        """Answer with `events`, the route's server-sent events over `outputs()`: read once the engine
        accepted the request, and ended by an error event if the generation fails after they began."""
        keepalive_s = self._request.app.state.settings.sse_keepalive_interval_s
        self._opened = await opened_within(cancel_on_disconnect(self._request, self._open), keepalive_s)
        return stream_response(self._opened, ending_in_error_event(events), keepalive_s)

    async def answer(self, events: Callable[[AsyncIterator[ChoiceOutput]], AsyncIterator[str]],
                     whole: Callable[[list[Collected]], T], response: Response) -> T | Response:
        """The route's answer: with stream=true, `events` over `outputs()` (stream); else `whole` of the
        collected choices, or a bare 499 for a client that left first. Ignored fields are named on either."""
        body = self._plan.body
        if body.stream:
            result: T | Response = await self.stream(events(self.outputs()))
        else:
            collected = await self.collect()
            result = Response(status_code=CLIENT_CLOSED_REQUEST) if collected is None else whole(collected)
        return name_ignored_fields(result, response, body)

    async def outputs(self) -> AsyncIterator[ChoiceOutput]:
        """Every choice's outputs as (choice index, output), for the events handed to `stream`: they are
        read only once it opened the generation, so this starts after `stream` set it."""
        assert self._opened is not None and self._opened.done(), "read by the events of stream() only"
        async for item in revocable(self._opened.result(), self._revocation):
            yield item


def name_ignored_fields(result: T | Response, response: Response, body: GenerationRequest) -> T | Response:
    """Name the accepted-and-ignored fields the client sent in a header of the answer: on `result` when it
    is a response already (a stream), else on the route's `response` (FastAPI merges its headers)."""
    names = ignored_field_names(body)
    if names:
        logger.debug("request fields ignored: %s", ", ".join(names))
        (result if isinstance(result, Response) else response).headers[IGNORED_FIELDS_HEADER] = ", ".join(names)
    return result
