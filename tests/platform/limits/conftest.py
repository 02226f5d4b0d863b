"""The rate-limit tests' live API (limits_live.py), one per module."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from limits_live import LimitsServer, serve_limits


@pytest.fixture(scope="module")
def limits_server(model_dir, tmp_path_factory) -> Iterator[LimitsServer]:
    """Per-minute limits over a minute: nothing refills noticeably while a test runs. Full as soon as
    one request waits in the engine (tests send one at a time, but for the full-server test)."""
    yield from serve_limits(model_dir, tmp_path_factory.mktemp("limits"), max_waiting_requests=0)
