"""The OpenAPI document is the API's contract: schemathesis (every check, every phase, the stateful one
following the document's links from each create route to the routes that take what it made) against a
live app on the bundled model. Any finding fails the test, with schemathesis' report of it.

Bounded for `make test`: a fixed seed, a few examples per operation, a time budget, and generations of a
few tokens (schemathesis_hooks.py). The run is a child process (schemathesis' own CLI: its phases, link
inference and report) against the app served from this process, as the other live-API tests serve it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_api import make_key, migrated_settings, serve_in_thread

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.app import create_app
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.lookup import registry_lookup_from_settings
from loraloom.platform.storage import storage_from_settings
from loraloom.platform.training.jobs import find_checkpoint

HERE = Path(__file__).resolve().parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# Small enough for a minute or two of `make test` on two cores; a fixed seed makes a finding reproducible.
EXAMPLES_PER_OPERATION = 8
TIME_BUDGET_S = 90
SEED = 37
# max_response_time, one of the checks: here it catches a request that hangs, not a slow machine (two
# cores shared with the rest of `make test` answer in seconds what a quiet one answers in milliseconds).
MAX_RESPONSE_TIME_S = 60


@pytest.fixture(scope="module")
def contract_server(model_dir, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(URL, the operator's key) of an app with a registry, no training worker (jobs stay queued)."""
    settings = migrated_settings(tmp_path_factory.mktemp("contract"))
    operator = make_key(settings, tenant="default", role="admin")
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    local = LocalAdapterLookup({engine.model_name}, {}, None)
    lookup = registry_lookup_from_settings(settings, store, local, find_checkpoint=find_checkpoint)
    with serve_in_thread(create_app(engine, lookup, settings)) as url:
        yield url, operator


def test_the_server_keeps_its_openapi_contract(contract_server, tmp_path):
    url, operator = contract_server
    assert SCHEMATHESIS.is_file(), "schemathesis is not installed: `make setup` installs the dev extras"
    report = tmp_path / "report"
    command = [
        str(SCHEMATHESIS), "--config-file", str(HERE / "schemathesis.toml"), "run", f"{url}/openapi.json",
        "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(EXAMPLES_PER_OPERATION), "--max-time", str(TIME_BUDGET_S), "--seed", str(SEED),
        "--header", f"Authorization: Bearer {operator}", "--workers", "1", "--request-timeout", "120",
        "--max-response-time", str(MAX_RESPONSE_TIME_S),
        "--generation-database", "none", "--no-color", "--report", "junit", "--report-dir", str(report),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIME_BUDGET_S * 4)
    shutil.rmtree(report, ignore_errors=True)
    assert run.returncode == 0, f"schemathesis found the server breaking its OpenAPI document:\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
