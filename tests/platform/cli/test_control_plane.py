"""`loraloom serve --no-engine` as the Kubernetes kit runs it (deploy/kubernetes/control-plane.yaml):
a control-plane process and an engine process, both `loraloom serve`, over one PostgreSQL database
and one blob store. An adapter uploaded and aliased through the control plane is served by the engine
process; the control plane answers the registry, /v1/models and /health as a server with an engine
does, refuses generation with a 503 naming the gateway, and reports no engine in /v1/engine/status."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from live_api import bearer, make_key, migrated_settings, served_url
from lora_factory import make_peft_adapter

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script
START_TIMEOUT_S = 300  # the engine's model loads on two shared, busy cores
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


@contextmanager
def served(arguments: list[str], env: dict[str, str], log: Path) -> Iterator[str]:
    process = subprocess.Popen([str(LORALOOM), "serve", "--port", "0", "--no-worker", *arguments],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        yield served_url(process, log, START_TIMEOUT_S)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_control_plane_manages_adapters_that_the_engine_process_serves(
    model_dir, tiny_llama_dir, tmp_path, postgres_database_url
):
    settings = migrated_settings(tmp_path / "data", postgres_database_url)
    developer = bearer(make_key(settings, tenant="acme", role="developer"))
    env = {**os.environ, "LORALOOM_DATABASE_URL": postgres_database_url, "LORALOOM_DATA_DIR": str(tmp_path / "data"),
           "LORALOOM_STORAGE_URL": (tmp_path / "blobs").as_uri()}
    adapter = make_peft_adapter(model_dir, tmp_path / "bot", rank=4, alpha=8, target_modules=["q_proj"], seed=5)
    misfit = make_peft_adapter(tiny_llama_dir, tmp_path / "misfit", rank=4, alpha=8, target_modules=["q_proj"], seed=5)
    request = {"model": "bot:prod", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}

    with served(["--no-engine"], env, tmp_path / "control.log") as control_url, \
            httpx.Client(base_url=control_url, headers=developer, timeout=120) as control:
        assert control.get("/health").json()["status"] == "ok"
        assert model_dir.name in {card["id"] for card in control.get("/v1/models").json()["data"]}
        # The upload checks run against the base's config without its weights: another base's adapter
        # (other shapes) is refused, this base's is taken.
        misfit_files = [("files", (name, (misfit / name).read_bytes())) for name in PEFT_FILES]
        refused_upload = control.post("/v1/adapters/misfit/versions", files=misfit_files)
        assert refused_upload.status_code == 400 and refused_upload.json()["error"]["code"] == "invalid_adapter"
        files = [("files", (name, (adapter / name).read_bytes())) for name in PEFT_FILES]
        assert control.post("/v1/adapters/bot/versions", files=files).status_code == 201
        assert control.put("/v1/adapters/bot/aliases/prod", json={"version": 1}).status_code == 200
        assert "bot" in {card["id"] for card in control.get("/v1/models").json()["data"]}

        for path, body in (("/v1/completions", request),
                           ("/v1/chat/completions", {"model": "bot:prod", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "Hi"}]})):
            refused = control.post(path, json=body)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "no_engine" and "inference gateway" in error["message"]
            assert "Retry-After" not in refused.headers  # sending it here again cannot help
        status = control.get("/v1/engine/status").json()
        assert status["device"] == "none" and status["num_running"] == 0

        with served(["--num-kv-blocks", "64"], env, tmp_path / "engine.log") as engine_url, \
                httpx.Client(base_url=engine_url, headers=developer, timeout=300) as engine:
            answer = engine.post("/v1/completions", json=request)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["text"]
            assert engine.get("/v1/engine/status").json()["device"] == "cpu"
