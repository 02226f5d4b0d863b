"""A choice's generated text as OpenAI returns it when tools were offered: content and tool_calls,
whole (ToolAnswer) or as streamed deltas (ToolStream).

finish_reason as OpenAI sets it: "tool_calls" when the model called (auto or required), "stop" for
a named tool_choice, whatever generation ended with otherwise.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from loraloom.platform.api.tools.formats import Parsed, ToolFormat
from loraloom.platform.api.tools.live_calls import LiveCalls
from loraloom.platform.api.tools.request import ToolRequest
from loraloom.platform.api.tools.shapes import FunctionCall, FunctionCallDelta, ToolCallDelta, ToolCallItem


@dataclass(frozen=True)
class ToolAnswer:
    content: str | None
    tool_calls: list[ToolCallItem] | None
    finish_reason: str | None


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_answer(text: str, finish_reason: str | None, request: ToolRequest | None, tool_format: ToolFormat) -> ToolAnswer:
    """The whole message of one choice."""
    if request is None or request.mode == "none":
        return ToolAnswer(text, None, finish_reason)
    parsed = _parsed(text, request, tool_format)
    if not parsed.calls:
        return ToolAnswer(text, None, finish_reason)
    calls = [ToolCallItem(id=call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
             for call in parsed.calls]
    return ToolAnswer(None if request.constrained else parsed.content, calls, _calls_finish(request))


def _parsed(text: str, request: ToolRequest, tool_format: ToolFormat) -> Parsed:
    parsed = tool_format.parse(text, request.names)
    if not request.parallel and len(parsed.calls) > 1:  # parallel_tool_calls false: the first call only
        return Parsed(parsed.content, parsed.calls[:1])
    return parsed


def _calls_finish(request: ToolRequest) -> str:
    return "stop" if request.mode == "named" else "tool_calls"


class ToolStream:
    """One choice's stream. Constrained answers stream their calls as they are generated (LiveCalls).
    Free ones pass content through until calls may be starting (the format's start marker); from there the
    text is held and read by LiveCalls as well, which streams each call to an offered function as it is
    generated once its head is complete. If no call began by the end, the held text is read whole (content
    again if it does not read as calls)."""

    def __init__(self, request: ToolRequest, tool_format: ToolFormat) -> None:
        self.request = request
        self.format = tool_format
        self.text = ""
        self.sent = 0  # characters of text already sent as content
        # Where calls are read from: constrained answers are calls from their first token.
        self.live = LiveCalls(tool_format, call_id) if request.constrained else None

    def feed(self, delta: str) -> tuple[str, list[ToolCallDelta]]:
        """The content that may be sent now, and the calls' deltas."""
        self.text += delta
        content = ""
        if self.live is None:
            start = self.format.find_start(self.text)
            end = start if start >= 0 else self.format.hold_from(self.text)
            content, self.sent = self.text[self.sent:end], max(self.sent, end)
            if start < 0:
                return content, []
            # Calls may start here: what follows is held, and read as calls as far as it reads as calls.
            self.live = LiveCalls(tool_format=self.format, call_id=call_id, offered=self.request.names,
                                  max_calls=None if self.request.parallel else 1, start=start)
        return content, self.live.advance(self.text)

    def finish(self, finish_reason: str | None) -> tuple[str, list[ToolCallDelta], str | None]:
        """(content not sent yet, the calls' deltas, the finish reason) once generation ended."""
        if self.live is not None and self.live.count:  # sent as they came; cut short, they stay cut
            return "", [], finish_reason if finish_reason == "length" else _calls_finish(self.request)
        parsed = _parsed(self.text, self.request, self.format) if self.live is not None else Parsed(self.text, [])
        if not parsed.calls:
            rest, self.sent = self.text[self.sent:], len(self.text)
            return rest, [], finish_reason
        deltas = []
        for index, call in enumerate(parsed.calls):
            # As OpenAI streams a call: id, type and name first (empty arguments), then the arguments.
            deltas.append(ToolCallDelta(index=index, id=call_id(), type="function",
                                        function=FunctionCallDelta(name=call.name, arguments="")))
            deltas.append(ToolCallDelta(index=index, function=FunctionCallDelta(arguments=call.arguments)))
        return "", deltas, _calls_finish(self.request)
