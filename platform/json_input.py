"""JSON from users, beyond what json.loads checks: the two inputs it lets through or fails on in a
way that became a 500 further on.

- Nesting deeper than its recursive parser allows raises RecursionError, which is no ValueError.
- A lone UTF-16 surrogate escape ("\\ud800") parses into a Python str that no UTF-8 encoder (the
  tokenizer, the database driver) accepts.

A bottom layer, like settings.py: the API's request bodies and training's JSONL lines both use it.
"""
from __future__ import annotations

import json
import re
from typing import Any

# A surrogate can only reach a parsed str through a \uD800-\uDFFF escape (raw surrogate bytes are
# invalid UTF-8 and refused by the decoder): texts without one need no walk.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class JsonInputError(ValueError):
    """JSON refused; `path` names the value at fault ("messages[0].content"), None for the whole text."""

    def __init__(self, message: str, path: str | None) -> None:
        super().__init__(message)
        self.path = path


def too_deep_message(what: str) -> str:
    return f"{what} nests arrays or objects too deeply to parse; flatten it (a few levels are enough)"


def lone_surrogate_message(path: str) -> str:
    return (f"{path}: contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text; "
            "send valid Unicode (a surrogate escape only as a high-low pair)")


def may_hold_surrogates(raw: bytes) -> bool:
    return SURROGATE_ESCAPE.search(raw) is not None


def lone_surrogate_path(value: Any) -> str | None:
    """The path ("messages[0].content", "" for `value` itself) of the first string, key or value,
    that cannot be encoded as UTF-8; None if every one can. Iterative: the value may be nested as
    deep as json.loads allows, close to the interpreter's recursion limit."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                # A key at fault is named escaped: the message itself must stay encodable.
                name = key if _encodable(key) else key.encode("utf-8", "backslashreplace").decode()
                child_path = f"{path}.{name}" if path else name
                if name is not key:
                    return child_path
                pending.append((child_path, child))
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", child) for index, child in reversed(list(enumerate(item))))
    return None


def parse_json(text: str | bytes, what: str) -> Any:
    """json.loads, also refusing (JsonInputError, a ValueError) nesting too deep for the parser and
    lone surrogates. `what` names the text in messages ("line 3"). JSONDecodeError passes through."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonInputError(too_deep_message(what), None) from None
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    path = lone_surrogate_path(value) if may_hold_surrogates(raw) else None
    if path is not None:
        raise JsonInputError(lone_surrogate_message(path or what), path or None)
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
