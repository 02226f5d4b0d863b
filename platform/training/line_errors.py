"""What a dataset line's check raises, shared by every format's checks (datasets.py, preference_data.py)."""
from __future__ import annotations


class InvalidLine(Exception):
    """One line's first problem; the scan adds the line number."""

    def __init__(self, reason: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason  # stable code, counted per reason in the report
        self.message = message  # what is wrong and how to fix it
        self.param = param  # where inside the line, e.g. "input.messages[0].role"


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
