"""POST /v1/chat/completions."""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from loraloom.engine import RequestOutput, TokenLogprob
from loraloom.platform.api.chat_templates import chat_tokenizer, tool_parser
from loraloom.platform.api.deps import CallerDep, ChatUsageMeterDep, EngineDep, LookupDep
from loraloom.platform.api.errors import ERROR_RESPONSES
from loraloom.platform.api.generation.adapters import resolve_adapter
from loraloom.platform.api.generation.choices import ChoiceOutput
from loraloom.platform.api.generation.collect import Collected, usage
from loraloom.platform.api.generation.respond import GenerationPlan, ResponseHead, start_generation
from loraloom.platform.api.generation.streaming import SSE_DONE, sse_event, sse_response_doc
from loraloom.platform.api.rate_limits import RATELIMIT_HEADERS_DOC, rate_limited_responses
from loraloom.platform.api.schemas.chat import (
    AssistantMessage,
    ChatChoice,
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatTokenLogprob,
)
from loraloom.platform.api.schemas.generation import TopLogprob
from loraloom.platform.api.tools.plan import ToolPlan, plan_tools

router = APIRouter(tags=["chat"])


def token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(logprobs: list[TokenLogprob]) -> ChatChoiceLogprobs:
    return ChatChoiceLogprobs(
        content=[
            ChatTokenLogprob(
                token=entry.token,
                logprob=entry.logprob,
                bytes=token_bytes(entry.token),
                top_logprobs=[
                    TopLogprob(token=token, logprob=logprob, bytes=token_bytes(token))
                    for _, token, logprob in entry.top
                ],
            )
            for entry in logprobs
        ]
    )


def chat_choice(index: int, collected: Collected, tools: ToolPlan) -> ChatChoice:
    logprobs = chat_logprobs(collected.logprobs) if collected.logprobs is not None else None
    answer = tools.answer(collected.text, collected.finish_reason)
    return ChatChoice(
        index=index, message=AssistantMessage(content=answer.content, tool_calls=answer.tool_calls),
        logprobs=logprobs, finish_reason=answer.finish_reason,
    )


def chat_completion(collected: list[Collected], head: ResponseHead, *, tools: ToolPlan) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        id=head.id, created=head.created, model=head.model,
        choices=[chat_choice(index, choice, tools) for index, choice in enumerate(collected)],
        usage=usage([choice.last for choice in collected]),
    )


async def chat_event_stream(
    outputs: AsyncIterator[ChoiceOutput], head: ResponseHead, include_usage: bool, *, tools: ToolPlan
) -> AsyncGenerator[str, None]:
    """OpenAI's chunk sequence: the role first, then content deltas, then the finish reason in an
    empty delta, then (if asked) usage with no choices. Each choice's chunks carry its index; with
    several choices their chunks interleave as the choices generate. With tools, text that may be
    calls is held back, and calls are sent as tool_calls deltas as they are generated (tools/live_calls.py),
    or, for text read as calls only once it ended, before the finish reason."""

    def chunk(choice: ChatChunkChoice | None, lasts: list[RequestOutput] | None = None) -> str:
        return sse_event(
            ChatCompletionChunk(
                id=head.id,
                created=head.created,
                model=head.model,
                choices=[] if choice is None else [choice],
                usage=None if lasts is None else usage(lasts),
            )
        )

    for index in range(head.num_choices):
        role_delta = ChatDelta(role="assistant", content="")
        yield chunk(ChatChunkChoice(index=index, delta=role_delta, logprobs=None, finish_reason=None))
    lasts: dict[int, RequestOutput] = {}
    readers = {index: tools.stream() for index in range(head.num_choices)}
    async for index, output in outputs:
        lasts[index] = output
        reader = readers[index]
        content, calls = (output.text_delta, []) if reader is None else reader.feed(output.text_delta)
        if content or output.logprobs:
            logprobs = chat_logprobs(output.logprobs) if output.logprobs is not None else None
            delta = ChatDelta(content=content)
            yield chunk(ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=None))
        for call in calls:
            yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(tool_calls=[call]), logprobs=None,
                                        finish_reason=None))
        if output.finished:
            finish_reason = output.finish_reason
            if reader is not None:
                rest, calls, finish_reason = reader.finish(finish_reason)
                if rest:
                    yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(content=rest), logprobs=None,
                                                finish_reason=None))
                for call in calls:
                    yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(tool_calls=[call]), logprobs=None,
                                                finish_reason=None))
            yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(), logprobs=None, finish_reason=finish_reason))
    if include_usage and len(lasts) == head.num_choices:
        yield chunk(None, [lasts[index] for index in range(head.num_choices)])
    yield SSE_DONE


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: {**sse_response_doc(ChatCompletionChunk), "headers": RATELIMIT_HEADERS_DOC}, **ERROR_RESPONSES,
               **rate_limited_responses()},
)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    engine: EngineDep,
    lookup: LookupDep,
    meter: ChatUsageMeterDep,
    caller: CallerDep,
    response: Response,
) -> ChatCompletionResponse | Response:
    adapter = await resolve_adapter(lookup, body, caller.tenant_id, meter)
    meter.request_metadata = body.metadata
    # What the template or the messages refuse is a ChatTemplateError naming its field: a 400 (api/errors.py).
    tokenizer = chat_tokenizer(engine.tokenizer, adapter)
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, wants_json=body.wants_json,
                       parser=tool_parser(request.app.state.settings.tool_parser, adapter.named),
                       template=tokenizer.chat_template)
    messages, template_tools = tools.template_input(
        [message.model_dump(exclude_none=True) for message in body.messages], tokenizer.template_renders_tools)
    # Off the event loop: templating and tokenizing a long conversation takes a while.
    prompt_token_ids = await run_in_threadpool(tokenizer.encode_chat, messages, True, template_tools)
    plan = GenerationPlan(body=body, id_prefix="chatcmpl", prompt_token_ids=prompt_token_ids, adapter=adapter,
                          max_tokens=body.requested_max_tokens, logprobs=body.engine_logprobs,
                          tool_grammar=tools.grammar)
    generation = await start_generation(request, engine, plan, meter)
    return await generation.answer(
        lambda outputs: chat_event_stream(outputs, generation.head, body.include_usage, tools=tools),
        lambda collected: chat_completion(collected, generation.head, tools=tools), response)
