"""POST /v1/completions (OpenAI's legacy text completions)."""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from loraloom.engine import RequestOutput, TokenLogprob, Tokenizer
from loraloom.platform.api.deps import CallerDep, CompletionUsageMeterDep, EngineDep, LookupDep
from loraloom.platform.api.errors import ERROR_RESPONSES
from loraloom.platform.api.generation.adapters import resolve_adapter
from loraloom.platform.api.generation.choices import ChoiceOutput
from loraloom.platform.api.generation.collect import Collected, usage
from loraloom.platform.api.generation.respond import GenerationPlan, ResponseHead, start_generation
from loraloom.platform.api.generation.streaming import SSE_DONE, sse_event, sse_response_doc
from loraloom.platform.api.rate_limits import RATELIMIT_HEADERS_DOC, rate_limited_responses
from loraloom.platform.api.schemas.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    PromptInput,
)

router = APIRouter(tags=["completions"])


def prompt_token_ids(tokenizer: Tokenizer, prompt: PromptInput) -> list[int]:
    """Text is encoded with the model's special tokens (BOS), token ids are taken as they are."""
    single = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else prompt
    if isinstance(single, str):
        return tokenizer.encode(single, add_special_tokens=True)
    return list(single)


def completion_logprobs(logprobs: list[TokenLogprob], text_offset: int) -> tuple[CompletionLogprobs, int]:
    """OpenAI's completion logprobs; offsets count characters of the completion from
    `text_offset` (where the previous chunk ended). Returns the offset after these tokens."""
    offsets = []
    for entry in logprobs:
        offsets.append(text_offset)
        text_offset += len(entry.token)
    formatted = CompletionLogprobs(
        tokens=[entry.token for entry in logprobs],
        token_logprobs=[entry.logprob for entry in logprobs],
        top_logprobs=[{token: logprob for _, token, logprob in entry.top} for entry in logprobs],
        text_offset=offsets,
    )
    return formatted, text_offset


def echoed_prompt(tokenizer: Tokenizer, prompt: PromptInput, prompt_ids: list[int]) -> str:
    """What `echo` puts before the completion: the prompt's text as sent, or its token ids decoded."""
    single = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else prompt
    return single if isinstance(single, str) else tokenizer.decode(prompt_ids, skip_special_tokens=False)


def completion_choice(index: int, collected: Collected, echo_text: str = "") -> CompletionChoice:
    logprobs = None
    if collected.logprobs is not None:
        logprobs, _ = completion_logprobs(collected.logprobs, 0)
    return CompletionChoice(index=index, text=echo_text + collected.text, logprobs=logprobs,
                            finish_reason=collected.finish_reason)


def completion(collected: list[Collected], head: ResponseHead, *, echo_text: str = "") -> Completion:
    return Completion(
        id=head.id, created=head.created, model=head.model,
        choices=[completion_choice(index, choice, echo_text) for index, choice in enumerate(collected)],
        usage=usage([choice.last for choice in collected]),
    )


async def completion_event_stream(
    outputs: AsyncIterator[ChoiceOutput], head: ResponseHead, include_usage: bool, *, echo_text: str = ""
) -> AsyncGenerator[str, None]:
    """One chunk per output with text, logprobs or the finish reason, carrying its choice's index;
    then (if asked) usage with no choices. With `echo_text`, each choice's first chunk is that text."""

    def chunk(choices: list[CompletionChoice], lasts: list[RequestOutput] | None = None) -> str:
        return sse_event(
            Completion(
                id=head.id,
                created=head.created,
                model=head.model,
                choices=choices,
                usage=None if lasts is None else usage(lasts),
            )
        )

    if echo_text:
        for index in range(head.num_choices):
            yield chunk([CompletionChoice(index=index, text=echo_text, logprobs=None, finish_reason=None)])
    text_offsets = [0] * head.num_choices
    lasts: dict[int, RequestOutput] = {}
    async for index, output in outputs:
        lasts[index] = output
        if not (output.text_delta or output.logprobs or output.finished):
            continue
        logprobs = None
        if output.logprobs is not None:
            logprobs, text_offsets[index] = completion_logprobs(output.logprobs, text_offsets[index])
        finish_reason = output.finish_reason if output.finished else None
        yield chunk([CompletionChoice(index=index, text=output.text_delta, logprobs=logprobs,
                                      finish_reason=finish_reason)])
    if include_usage and len(lasts) == head.num_choices:
        yield chunk([], [lasts[index] for index in range(head.num_choices)])
    yield SSE_DONE


@router.post(
    "/v1/completions",
    response_model=Completion,
    responses={200: {**sse_response_doc(Completion), "headers": RATELIMIT_HEADERS_DOC}, **ERROR_RESPONSES,
               **rate_limited_responses()},
)
async def create_completion(
    body: CompletionRequest,
    request: Request,
    engine: EngineDep,
    lookup: LookupDep,
    meter: CompletionUsageMeterDep,
    caller: CallerDep,
    response: Response,
) -> Completion | Response:
    adapter = await resolve_adapter(lookup, body, caller.tenant_id, meter)
    # Off the event loop: tokenizing a long prompt takes a while.
    prompt_ids = await run_in_threadpool(prompt_token_ids, engine.tokenizer, body.prompt)
    echo_text = echoed_prompt(engine.tokenizer, body.prompt, prompt_ids) if body.echo else ""
    plan = GenerationPlan(body=body, id_prefix="cmpl", prompt_token_ids=prompt_ids, adapter=adapter,
                          max_tokens=body.max_tokens, logprobs=body.logprobs)
    generation = await start_generation(request, engine, plan, meter)
    return await generation.answer(
        lambda outputs: completion_event_stream(outputs, generation.head, body.include_usage, echo_text=echo_text),
        lambda collected: completion(collected, generation.head, echo_text=echo_text), response)
