"""Calls streamed as they are generated: each call's id, type and name as soon as its head is complete,
then its arguments in the fragments the model writes them in, as OpenAI streams.

Constrained (`required`, named) answers: their grammar fixes the layout (`{"name": "...", "<arguments
key>": {...}}` in the family's wrapping) and the names, so what is scanned is known to become a call.

Free (`auto`) answers are read this way from where the format's calls may start (results.ToolStream):
a call begins once its head, written with any spacing and either arguments key, names an offered
function, stands where calls stand (after the family's wrapping, or the previous call, and nothing else)
and opens its arguments object. Until one begins, nothing is sent, and the answer may still turn out to be
content. Once one has, the stream is committed to calls: the first head that breaks the rules (an
unknown name, text between calls) ends the reading, and what was sent stands, as a call cut short by
max_tokens does.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from loraloom.platform.api.tools.formats import ToolFormat
from loraloom.platform.api.tools.shapes import FunctionCallDelta, ToolCallDelta

_NAME = r'"([A-Za-z0-9_-]{1,64})"'  # a function name as request.py allows them
# A free call's head: any spacing, either arguments key (formats._call reads both), and its arguments' brace
# ahead: arguments written as a JSON string are left to the whole answer's parse.
_FREE_HEAD = re.compile(r'\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
# What may stand between where calls start (or the previous call's arguments) and a free call's head: the
# families' wrapping (<tool_call>, its closing tag, Llama's <|python_tag|>, list brackets, separators), the
# closing brace of the previous call's object, and spacing.
_BETWEEN_CALLS = re.compile(r"(?:\s|[\[\]},;]|<tool_call>|</tool_call>|<\|python_tag\|>)*")


class LiveCalls:
    def __init__(
        self,
        tool_format: ToolFormat,
        call_id: Callable[[], str],
        *,
        offered: frozenset[str] | set[str] | None = None,
        max_calls: int | None = None,
        start: int = 0,
    ) -> None:
        """`offered` None: a constrained answer. Otherwise a free one, read from `start` (where its calls may
        begin) for calls to the `offered` functions, at most `max_calls` of them (None: any number)."""
        key = re.escape(tool_format.arguments_key)
        self._head = _FREE_HEAD if offered is not None else re.compile(r'\{"name": ' + _NAME + ', "' + key + r'": ')
        self._offered = offered
        self._max_calls = max_calls
        self._call_id = call_id
        self._scan_from = start  # where the next call's head may begin
        self._arguments_at: int | None = None  # where the open call's arguments begin
        self._sent = 0  # characters of the open call's arguments already sent
        self._ended = False  # a free answer whose calls ended: nothing more is read
        self.count = 0  # calls begun

    def advance(self, text: str) -> list[ToolCallDelta]:
        """The deltas `text` (all generated so far) adds."""
        deltas = []
        while not self._ended:
            if self._arguments_at is None:
                if self._max_calls is not None and self.count >= self._max_calls:
                    self._ended = True
                    break
                head = self._head.search(text, self._scan_from)
                if head is None:
                    break
                if not self._begins_call(text, head):
                    self._ended = True
                    break
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
                break
            self._scan_from, self._arguments_at = end, None
        return deltas

    def _begins_call(self, text: str, head: re.Match[str]) -> bool:
        """A constrained head always does; a free one must name an offered function where a call stands."""
        if self._offered is None:
            return True
        between = _BETWEEN_CALLS.fullmatch(text, self._scan_from, head.start())
        return head.group(1) in self._offered and between is not None


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
