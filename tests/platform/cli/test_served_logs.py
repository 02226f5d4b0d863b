"""What `loraloom serve` writes, as a log shipper collects it: a real serve process (with the training
worker it starts, which shares its stderr) on a fresh data directory. Every line of its stderr is one
JSON object, Celery's worker's included, and stdout stays empty; a completion's request line names
the tenant by name and the adapter both as the request wrote it (`bot:prod`) and as it resolved
(`bot@1`); a polling route (the engine status) writes no line at INFO; the bootstrap admin key is in
a file only its user can read, and nowhere in the stream, which names the file."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
from live_api import bearer, make_key, migrated_settings, served_url, wait_until
from lora_factory import make_peft_adapter

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script
START_TIMEOUT_S = 300  # the model loads on two shared, busy cores
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def json_lines(text: str) -> list[dict]:
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"stderr line {number} is not JSON: {line!r}") from None
        assert isinstance(lines[-1], dict) and {"time", "level", "logger", "message"} <= lines[-1].keys(), line
    return lines


def test_every_served_line_is_json_with_names_and_no_secret(model_dir, tmp_path):
    data_dir = tmp_path / "data"
    log = tmp_path / "serve.log"
    stdout = tmp_path / "serve.stdout"
    with open(stdout, "w") as out:
        process = subprocess.Popen(
            [str(LORALOOM), "serve", "--port", "0", "--num-kv-blocks", "64"],
            stdout=out, stderr=subprocess.PIPE, text=True, env={**os.environ, "LORALOOM_DATA_DIR": str(data_dir)},
        )
    try:
        url = served_url(process, log, START_TIMEOUT_S)
        key_file = data_dir / "bootstrap-admin-key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        bootstrap_key = key_file.read_text().strip()
        # The worker logs through the same stream: wait for Celery's lines to be part of what is checked.
        wait_until(lambda: '"celery.apps.worker"' in log.read_text(), "the training worker's ready line",
                   START_TIMEOUT_S)

        developer = make_key(migrated_settings(data_dir), tenant="acme", role="developer")
        adapter = make_peft_adapter(model_dir, tmp_path / "bot", rank=4, alpha=8, target_modules=["q_proj"], seed=5)
        with httpx.Client(base_url=url, headers=bearer(developer), timeout=300) as http:
            files = [("files", (name, (adapter / name).read_bytes())) for name in PEFT_FILES]
            assert http.post("/v1/adapters/bot/versions", files=files).status_code == 201
            assert http.put("/v1/adapters/bot/aliases/prod", json={"version": 1}).status_code == 200
            completion = http.post("/v1/completions", json={"model": "bot:prod", "prompt": "Hi", "max_tokens": 2},
                                   headers={"X-Request-ID": "logged-1"})
            assert completion.status_code == 200, completion.text
            assert http.get("/v1/engine/status", headers={"X-Request-ID": "polled-1"}).status_code == 200
            assert http.get("/v1/models", headers={"X-Request-ID": "read-1"}).status_code == 200
        # The operator's key, read from its file, works.
        assert httpx.get(f"{url}/v1/tenants", headers=bearer(bootstrap_key), timeout=60).status_code == 200
        wait_until(lambda: '"read-1"' in log.read_text(), "the last request's line")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    # uvicorn's last line: the copy of stderr into the log file has reached the end.
    wait_until(lambda: "Finished server process" in log.read_text(), "the server's last line")
    text = log.read_text()
    lines = json_lines(text)
    assert stdout.read_text() == ""
    assert bootstrap_key not in text
    (notice,) = [line for line in lines if "bootstrap_key_file" in line]
    assert notice["bootstrap_key_file"] == str(key_file) and str(key_file) in notice["message"]
    assert any(line["logger"].startswith("celery") for line in lines)

    by_id = {line.get("request_id"): line for line in lines if line["logger"] == "loraloom.request"}
    request = by_id["logged-1"]
    assert (request["tenant"], request["adapter"], request["adapter_resolved"]) == ("acme", "bot:prod", "bot@1")
    assert (request["level"], request["route"], request["status"]) == ("INFO", "/v1/completions", 200)
    assert "polled-1" not in by_id and by_id["read-1"]["level"] == "INFO"
