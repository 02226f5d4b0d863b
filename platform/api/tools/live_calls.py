"""Constrained calls streamed as they are generated: each call's id, type and name as soon as its
name is complete, then its arguments in the fragments the model writes them in, as OpenAI streams.

Only constrained (`required`, named) answers are read this way: their grammar fixes the layout
(`{"name": "...", "<arguments key>": {...}}` in the family's wrapping), so what is scanned is known
to become a call. Free (`auto`) answers may still turn out not to be calls, and are read whole once
they end (results.ToolStream).
"""
from __future__ import annotations

import re

from loraloom.platform.api.tools.formats import ToolFormat
from loraloom.platform.api.tools.shapes import FunctionCallDelta, ToolCallDelta


class LiveCalls:
    def __init__(self, tool_format: ToolFormat, call_id) -> None:
        key = re.escape(tool_format.arguments_key)
        self._head = re.compile(r'\{"name": "([A-Za-z0-9_-]{1,64})", "' + key + r'": ')
        self._call_id = call_id
        self._scan_from = 0  # where the next call's head may begin
        self._arguments_at: int | None = None  # where the open call's arguments begin
        self._sent = 0  # characters of the open call's arguments already sent
        self.count = 0  # calls begun

    def advance(self, text: str) -> list[ToolCallDelta]:
        """The deltas `text` (all generated so far) adds."""
        deltas = []
        while True:
            if self._arguments_at is None:
                head = self._head.search(text, self._scan_from)
                if head is None:
                    return deltas
                deltas.append(ToolCallDelta(index=self.count, id=self._call_id(), type="function",
                                            function=FunctionCallDelta(name=head.group(1), arguments="")))
                self._arguments_at, self._sent = head.end(), 0
                self.count += 1
            end, complete = _json_extent(text, self._arguments_at)
            fragment = text[self._arguments_at + self._sent:end]
            if fragment:
                deltas.append(ToolCallDelta(index=self.count - 1, function=FunctionCallDelta(arguments=fragment)))
                self._sent += len(fragment)
            if not complete:
                return deltas
            self._scan_from, self._arguments_at = end, None


def _json_extent(text: str, start: int) -> tuple[int, bool]:
    """(end, complete) of the JSON object beginning at text[start]: the index after its closing brace,
    or len(text) while it is still open."""
    depth, in_string, escaped = 0, False, False
    for position in range(start, len(text)):
        char = text[position]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1, True
    return len(text), False
