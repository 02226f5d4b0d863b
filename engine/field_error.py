"""The one error a request the engine cannot serve raises, naming the request field at fault."""
from __future__ import annotations


class RequestFieldError(ValueError):
    """A request field this engine cannot serve. `field` names it as the engine's interface does
    (SamplingParams' fields, "prompt", "adapter", "response_format", "tools", "messages[0].role"), and
    `problem` says what is wrong and how to fix it. The gateway answers it with a 400 whose `param` is
    the field as its client spelled it (platform/api/errors.py), so no one reads the field back out of
    the message; str() is still "field: problem", for logs and for callers of the engine itself.

    A ValueError, as before it was typed: callers that catch ValueError still catch it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def __reduce__(self) -> tuple[type[RequestFieldError], tuple[str, str]]:
        # Ray hands a replica's error to the gateway pickled; the default would call cls(message).
        return type(self), (self.field, self.problem)
