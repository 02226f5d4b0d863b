"""A stream that fails after its 200 was sent ends with an error event, not a cut connection."""
from __future__ import annotations

import asyncio
import json

import pytest

from loraloom.engine import RequestFailedError
from loraloom.platform.api.sse import ending_in_error_event


async def events_then(error: Exception):
    yield 'data: {"choices": []}\n\n'
    raise error


def drained(error: Exception) -> list[str]:
    async def drain() -> list[str]:
        return [event async for event in ending_in_error_event(events_then(error))]

    return asyncio.run(drain())


def test_engine_failure_of_one_request_ends_its_stream_with_the_reason() -> None:
    events = drained(RequestFailedError("generation failed: adapter 'x' produced non-finite values"))
    assert events[0] == 'data: {"choices": []}\n\n'
    assert events[-1].startswith("data: ") and events[-1].endswith("\n\n")
    error = json.loads(events[-1][len("data: "):])["error"]
    assert error["type"] == "server_error" and error["code"] == "generation_failed"
    assert "non-finite" in error["message"]


@pytest.mark.parametrize("internal", [RuntimeError("/srv/data/blobs/ab12: corrupt"), KeyError("slot")])
def test_unexpected_failure_ends_the_stream_without_internals(internal: Exception) -> None:
    events = drained(internal)
    error = json.loads(events[-1][len("data: "):])["error"]
    assert error["message"] == "Internal server error" and error["type"] == "server_error"
