"""The OpenAPI document is the API's contract: schemathesis (every check, every phase, the stateful one
following the document's links from each create route to the routes that take what it made) against a
live app on the bundled model. Any finding fails the test, with schemathesis' report of it.

Before the run the fixture makes one of each resource that random data cannot make (an adapter from real
PEFT files, a dataset, a job on it), and schemathesis is told their ids for the path parameters that name
them, so that the routes behind those parameters are tested on something that exists; what the create
routes it can drive itself make (tenants, keys) reaches the others through the document's links.

Bounded for `make test`: a fixed seed, a few examples per operation, a time budget, and generations of a
few tokens (schemathesis_hooks.py). The run is a child process (schemathesis' own CLI: its phases, link
inference and report) against the app served from this process, as the other live-API tests serve it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_api import bearer, make_key, migrated_settings, serve_in_thread
from lora_factory import make_peft_adapter

from loraloom.engine.async_engine import AsyncEngine
from loraloom.engine.config import EngineConfig
from loraloom.platform.api.composition import compose_app
from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
from loraloom.platform.storage import storage_from_settings

HERE = Path(__file__).resolve().parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
# Small enough for a minute or two of `make test` on two cores; a fixed seed makes a finding reproducible.
EXAMPLES_PER_OPERATION = 8
TIME_BUDGET_S = 90
SEED = 37
# max_response_time, one of the checks: here it catches a request that hangs, not a slow machine (two
# cores shared with the rest of `make test` answer in seconds, and a loaded one in a minute, what a quiet
# one answers in milliseconds).
MAX_RESPONSE_TIME_S = 240
REQUEST_TIMEOUT_S = 300


ADAPTER = "contract-adapter"
DATASET = "".join(json.dumps({"messages": [{"role": "user", "content": f"Hi {n}"},
                                           {"role": "assistant", "content": f"Hello {n}."}]}) + "\n" for n in range(5))


def seed(url: str, key: str, peft: Path) -> dict[str, object]:
    """An adapter, a dataset and a queued job on it: the values of the path parameters that name them."""
    with httpx.Client(base_url=url, headers=bearer(key), timeout=300) as http:
        files = [("files", (name.name, name.read_bytes())) for name in sorted(peft.iterdir()) if name.is_file()]
        version = http.post(f"/v1/adapters/{ADAPTER}/versions", files=files)
        assert version.status_code == 201, version.text
        dataset = http.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("chat.jsonl", DATASET.encode())})
        assert dataset.status_code == 200, dataset.text
        model = http.get("/v1/models").json()["data"][0]["root"]
        # The first forward pass of a fresh engine takes far longer than the ones after: not in the run.
        warm = http.post("/v1/completions", json={"model": "base", "prompt": "Hi", "max_tokens": 1})
        assert warm.status_code == 200, warm.text
        job = http.post("/v1/fine_tuning/jobs", json={"model": model, "training_file": dataset.json()["id"]})
        assert job.status_code == 200, job.text
    return {"name": ADAPTER, "number": version.json()["version"],
            "file_id": dataset.json()["id"], "job_id": job.json()["id"]}


def run_config(directory: Path, parameters: dict[str, object]) -> Path:
    """schemathesis.toml with the seeded ids as the values of their path parameters."""
    lines = [(HERE / "schemathesis.toml").read_text(), "[parameters]"]
    lines += [f'"path.{name}" = {json.dumps(value)}' for name, value in parameters.items()]
    config = directory / "schemathesis.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


@pytest.fixture(scope="module")
def contract_server(model_dir, tmp_path_factory) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(URL, the operator's key, the seeded ids) of an app with a registry and no training worker (the
    job stays queued)."""
    peft = make_peft_adapter(model_dir, tmp_path_factory.mktemp("peft") / "adapter", rank=4, alpha=8,
                             target_modules=["q_proj"], seed=37)
    settings = migrated_settings(tmp_path_factory.mktemp("contract"))
    operator = make_key(settings, tenant="default", role="admin")
    store = storage_from_settings(settings)
    engine = AsyncEngine.create(model_dir, EngineConfig(num_kv_blocks=64), adapter_fetcher_from_settings(settings, store))
    with serve_in_thread(compose_app(settings, engine)) as url:
        yield url, operator, seed(url, operator, peft)


def test_the_server_keeps_its_openapi_contract(contract_server, tmp_path):
    url, operator, seeded = contract_server
    assert SCHEMATHESIS.is_file(), "schemathesis is not installed: `make setup` installs the dev extras"
    command = [
        str(SCHEMATHESIS), "--config-file", str(run_config(tmp_path, seeded)), "run", f"{url}/openapi.json",
        "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(EXAMPLES_PER_OPERATION), "--max-time", str(TIME_BUDGET_S), "--seed", str(SEED),
        "--header", f"Authorization: Bearer {operator}", "--workers", "1", "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--max-response-time", str(MAX_RESPONSE_TIME_S),
        "--generation-database", "none", "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIME_BUDGET_S * 4 + REQUEST_TIMEOUT_S)
    assert run.returncode == 0, f"schemathesis found the server breaking its OpenAPI document:\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
