"""Schemathesis hooks for the contract run (loaded through SCHEMATHESIS_HOOKS by test_schemathesis.py).

Generations are kept short: a test case may ask for thousands of tokens, which the bundled model on two
CPU cores would spend minutes on without telling the contract anything more. The document sets no upper
bound on these fields (the context left after the prompt is that bound, which no schema can state), so
lowering a large value never turns a case schemathesis meant to be invalid into a valid one."""
from __future__ import annotations

from typing import Any

import schemathesis

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# The most tokens a generated request may ask of the model; a request that names no limit (or null) gets
# this one: the server's default is the rest of the context.
MAX_TOKENS = 2
CAPPED_FIELDS = ("max_tokens", "max_completion_tokens")


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    if case.operation.path not in GENERATION_PATHS or not isinstance(case.body, dict):
        return
    if all(case.body.get(field) is None for field in CAPPED_FIELDS):
        case.body["max_tokens"] = MAX_TOKENS
    for field in CAPPED_FIELDS:
        value = case.body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            case.body[field] = MAX_TOKENS
