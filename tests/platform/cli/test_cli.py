"""The `loraloom` command: argument parsing, and `loraloom serve` end to end in a subprocess."""
from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from lora_factory import make_peft_adapter

from loraloom.engine.model.bundled import bundled_model_dir
from loraloom.engine.config import EngineConfig
from loraloom.platform.cli.main import build_parser, main
from loraloom.platform.cli.serve import (
    TOOL_PARSER_CHOICES,
    engine_config,
    fast_server_options,
    use_settings_defaults,
    worker_command,
)
from loraloom.platform.settings import TOOL_PARSER_CHOICES as SETTINGS_TOOL_PARSER_CHOICES
from loraloom.platform.settings import Settings

LORALOOM = Path(sys.executable).parent / "loraloom"  # the installed console script


@pytest.mark.parametrize("value", ["no-equals-sign", "=./path", "name=", "bad:name=./path", "bad@name=./path"])
def test_bad_adapter_syntax_is_an_argparse_error_naming_the_flag_and_form(capsys, value):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--adapter", value])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "--adapter" in error and "NAME=PATH" in error


def test_serve_offers_the_tool_parsers_the_settings_declare():
    assert TOOL_PARSER_CHOICES == SETTINGS_TOOL_PARSER_CHOICES


def test_same_adapter_name_twice_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--adapter", "a=./x", "--adapter", "a=./y"])
    assert "--adapter" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--max-loras", "--num-kv-blocks", "--block-size"])
def test_engine_sizes_must_be_positive(capsys, flag):
    with pytest.raises(SystemExit):
        main(["serve", flag, "0"])
    assert flag in capsys.readouterr().err


def test_serve_arguments_map_onto_engine_config():
    args = build_parser().parse_args(
        ["serve", "--adapter", "a=./one", "--adapter", "b=/abs/two", "--adapter-dir", "./many",
         "--max-loras", "3", "--max-lora-rank", "16", "--num-kv-blocks", "100", "--max-num-seqs", "7",
         "--max-num-batched-tokens", "300", "--block-size", "32"]
    )
    assert args.adapter == [("a", Path("./one")), ("b", Path("/abs/two"))]
    assert args.adapter_dir == Path("./many")
    assert args.model is None
    config = engine_config(args)
    assert (config.max_loras, config.max_lora_rank, config.num_kv_blocks) == (3, 16, 100)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.block_size) == (7, 300, 32)


def test_serve_device_flags_map_onto_engine_config():
    args = build_parser().parse_args(["serve", "--device", "cuda:1", "--gpu-memory-utilization", "0.75",
                                      "--enforce-eager"])
    config = engine_config(args)
    assert (config.device, config.dtype) == ("cuda:1", "bfloat16")  # a GPU defaults to bfloat16
    assert config.gpu_memory_utilization == 0.75 and config.enforce_eager
    config = engine_config(build_parser().parse_args(["serve", "--device", "cpu", "--dtype", "bfloat16"]))
    assert (config.device, config.dtype) == ("cpu", "bfloat16")


def test_the_metrics_adapter_cap_comes_from_the_flag_else_the_setting_else_the_engine_default(tmp_path):
    assert engine_config(build_parser().parse_args(["serve"])).metrics_max_adapters == 100
    for flags, setting, expected in ((["--metrics-max-adapters", "5"], 7, 5), ([], 7, 7), ([], None, 100)):
        args = build_parser().parse_args(["serve", *flags])
        use_settings_defaults(args, Settings(data_dir=tmp_path, metrics_max_adapters=setting))
        assert engine_config(args).metrics_max_adapters == expected, (flags, setting)


def test_scheduling_policy_flag_maps_onto_engine_config(capsys):
    assert engine_config(build_parser().parse_args(["serve"])).scheduling_policy == "fair"
    config = engine_config(build_parser().parse_args(["serve", "--device", "cpu", "--scheduling-policy", "fcfs"]))
    assert config.scheduling_policy == "fcfs"
    with pytest.raises(SystemExit):
        main(["serve", "--scheduling-policy", "lottery"])
    assert "--scheduling-policy" in capsys.readouterr().err


def test_speculation_flags_map_onto_engine_config_and_the_help_explains_them(capsys):
    assert engine_config(build_parser().parse_args(["serve"])).speculation == "auto"
    config = engine_config(build_parser().parse_args(["serve", "--speculation", "off", "--speculative-max-tokens", "3"]))
    assert (config.speculation, config.speculative_max_tokens) == ("off", 3)
    with pytest.raises(SystemExit):
        main(["serve", "--speculative-max-tokens", "0"])
    assert "--speculative-max-tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--speculation {auto,off}" in help_text and "exactly those of decoding one token at a time" in help_text


def test_generation_config_flag_maps_onto_engine_config(capsys):
    assert engine_config(build_parser().parse_args(["serve"])).generation_config == "auto"
    config = engine_config(build_parser().parse_args(["serve", "--device", "cpu", "--generation-config", "none"]))
    assert config.generation_config == "none"
    with pytest.raises(SystemExit):
        main(["serve", "--generation-config", "vllm"])
    assert "--generation-config" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "1.5", "most"])
def test_gpu_memory_utilization_must_be_a_fraction(capsys, value):
    with pytest.raises(SystemExit):
        main(["serve", "--gpu-memory-utilization", value])
    error = capsys.readouterr().err
    assert "--gpu-memory-utilization" in error and "(0, 1]" in error


def test_serve_defaults_are_the_engine_defaults():
    assert engine_config(build_parser().parse_args(["serve"])) == EngineConfig()


def test_the_worker_serve_starts_trains_for_serve_s_base_and_rank(tmp_path):
    command = worker_command(tmp_path / "base", None, 16)
    args = build_parser().parse_args(command[command.index("worker"):])
    assert (args.command, args.model, args.max_lora_rank) == ("worker", tmp_path / "base", 16)
    # A worker started on its own assumes servers of the engine's default sizes.
    assert build_parser().parse_args(["worker"]).max_lora_rank == EngineConfig().max_lora_rank


def test_serve_runs_uvicorn_on_uvloop_and_httptools():
    import uvicorn
    import uvloop
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    async def app(scope, receive, send) -> None: ...

    config = uvicorn.Config(app, **fast_server_options())
    config.load()  # resolves the names to the classes it will run
    assert config.http_protocol_class is HttpToolsProtocol
    loop = config.get_loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_model_import_bundled_prints_the_directory(capsys, model_dir):
    main(["model", "import-bundled"])
    printed = Path(capsys.readouterr().out.strip())
    assert printed == bundled_model_dir() == model_dir
    assert (printed / "config.json").is_file()


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_serve_reports_a_broken_adapter_and_serves_the_rest(tmp_path, model_dir):
    adapter_dir = tmp_path / "adapters"
    good = make_peft_adapter(model_dir, adapter_dir / "good", rank=4, alpha=8, target_modules=["q_proj"], seed=3)
    broken = adapter_dir / "broken"
    broken.mkdir()
    shutil.copy(good / "adapter_config.json", broken / "adapter_config.json")
    (broken / "adapter_model.safetensors").write_bytes(b"these bytes are not a safetensors file")
    # Good weights beside a chat template that does not compile: refused as a whole, named with the line.
    templated = Path(shutil.copytree(good, adapter_dir / "templated"))
    (templated / "chat_template.jinja").write_text("{% for message in messages %}\n{{ message.content }\n{% endfor %}")

    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        [str(LORALOOM), "serve", "--port", "0", "--adapter-dir", str(adapter_dir), "--num-kv-blocks", "64"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LORALOOM_DATA_DIR": str(data_dir)},
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stderr, lines), daemon=True).start()
    stderr: list[str] = []
    try:
        port = None
        while port is None:
            line = lines.get(timeout=120)
            assert line is not None, f"loraloom serve exited early:\n{''.join(stderr)}"
            stderr.append(line)
            match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            port = int(match.group(1)) if match else None
        startup_log = "".join(stderr)
        assert "'broken'" in startup_log and "not a valid safetensors file" in startup_log
        assert "adapter 'templated': chat_template: line 2:" in startup_log
        # A fresh data directory: migrated on start, and the bootstrap admin key written to a file.
        assert (data_dir / "loraloom.db").is_file()
        bootstrap_key = (data_dir / "bootstrap-admin-key").read_text().strip()
        assert bootstrap_key.startswith("ll-") and bootstrap_key not in startup_log

        auth = {"Authorization": f"Bearer {bootstrap_key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth) as client:
            served = [card["id"] for card in client.get("/v1/models").json()["data"]]
            assert served == ["base", model_dir.name, "broken", "good"]
            reply = client.post("/v1/completions", json={"model": "good", "prompt": "Hello", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            refused = client.post("/v1/completions", json={"model": "broken", "prompt": "Hello", "max_tokens": 2})
            assert refused.status_code == 400
            assert "not a valid safetensors file" in refused.json()["error"]["message"]
            chat = client.post("/v1/chat/completions", json={
                "model": "templated", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2})
            assert chat.status_code == 400
            assert chat.json()["error"]["message"].startswith("adapter 'templated': chat_template: line 2:")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
