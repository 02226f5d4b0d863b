"""A generation read to its end, for an answer that is not streamed, and the usage of its choices."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from loraloom.engine import RequestOutput, TokenLogprob
from loraloom.platform.api.generation.choices import ChoiceOutput
from loraloom.platform.api.schemas.generation import PromptTokensDetails, Usage


@dataclass
class Collected:
    """One choice's whole generation."""

    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None
    last: RequestOutput


async def collect(outputs: AsyncIterator[ChoiceOutput], num_choices: int) -> list[Collected]:
    texts: list[list[str]] = [[] for _ in range(num_choices)]
    logprobs: list[list[TokenLogprob] | None] = [None] * num_choices
    lasts: list[RequestOutput | None] = [None] * num_choices
    async for index, output in outputs:
        texts[index].append(output.text_delta)
        if output.logprobs is not None:
            logprobs[index] = (logprobs[index] or []) + output.logprobs
        lasts[index] = output
    assert all(last is not None for last in lasts), "every choice yields at least one output"
    return [Collected(text="".join(texts[index]), logprobs=logprobs[index], finish_reason=last.finish_reason,
                      last=last) for index, last in enumerate(lasts)]


def usage(lasts: list[RequestOutput]) -> Usage:
    """From each choice's last output: the prompt counted once (the choices share it), completions summed."""
    prompt = lasts[0]
    completion_tokens = sum(last.num_output_tokens for last in lasts)
    return Usage(
        prompt_tokens=prompt.num_prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt.num_prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=prompt.num_cached_tokens),
    )
