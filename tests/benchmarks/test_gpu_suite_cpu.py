"""benchmarks/gpu_suite.py, run the way the GPU machine runs it: a copy of the tree, no pip install.

The suite runs in a child interpreter started with -S and only the virtualenv's site-packages on
PYTHONPATH: without site initialization the editable install's .pth file (the only thing that
makes `loraloom` importable here) is never processed, so torch, transformers and peft import
but loraloom does not, and the suite has to map engine/ and kernels/ itself.

The child uses one OpenMP thread: on a shared two-core CI machine, two spinning OpenMP threads
per process stall each other and the run takes several times longer.
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from gpu_machine import ISOLATED_PYTHON, isolated_env

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks" / "gpu_suite.py"

# One prefix per figure of the list (CPU-small sizes: concurrency 4 and 8, 4 adapters).
EXPECTED_ROWS = [
    "check write_kv_cache", "check paged_attention", "check paged_attention (2 decodes alone: split-KV)",
    "check rms_norm", "check fused_add_rms_norm", "check rotary_write_kv_cache", "check add_lora",
    "ceiling: device copy bandwidth", "ceiling: matmul rate",
    "kernel paged_attention decode (1 x", "kernel paged_attention prefill", "kernel fused_add_rms_norm",
    "kernel add_lora",
    "batch-1 decode, 64 context, base", "batch-1 decode, 64 context, 1 adapter r16",
    "decode c=4, base only", "decode c=8, base only",
    "decode c=4, 4 adapters r16", "decode c=8, 4 adapters r16 / base",
    "decode c=4, 4 adapters, ranks 8/16/32/64", "decode c=8, 4 adapters, ranks 8/16/32/64 / base",
    "offline 24 in / 8 out", "time to first token, 64-token prompt",
    "cold load r16: storage -> host", "cold load r16: host -> GPU slot", "cold load r16: total",
    "decode step p99 of 4 running requests during the load",
    "12 requests 8 in / 4 out, all on 1 adapter", "12 requests 8 in / 4 out, Zipf(1.1) over 40 adapters",
    "Zipf traffic / single adapter",
    "peer HF+PEFT batch-1 decode, base", "peer HF+PEFT batch-1 decode, 1 adapter r16", "peer HF+PEFT decode c=4",
    "loraloom / peer, batch-1 decode, base", "loraloom / peer, decode c=4",
]


def isolated_python(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*ISOLATED_PYTHON, *args], cwd=REPO, env=isolated_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_the_isolated_interpreter_has_torch_but_not_loraloom() -> None:
    """Otherwise the suite test below would not show that the suite runs without an install."""
    probe = "import importlib.util as u; print(u.find_spec('torch') is not None, u.find_spec('loraloom') is None)"
    result = isolated_python("-c", probe, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu_suite") / "table.json"
    result = isolated_python(str(SUITE), "--cpu-small", "--num-layers", "2", "--json", str(out), timeout=240)
    assert result.returncode == 0, f"suite failed:\n{result.stderr[-4000:]}"
    return result, json.loads(out.read_text())


def test_cpu_mode_reports_every_scenario_with_a_number(suite_run) -> None:
    _, table = suite_run
    rows = table["rows"]
    names = [row["scenario"] for row in rows]
    for expected in EXPECTED_ROWS:
        assert any(name.startswith(expected) for name in names), f"no row {expected!r} in {names}"
    for row in rows:
        assert math.isfinite(row["value"]), row
        if row["passed"] is None:
            assert row["value"] > 0, row  # every timed figure measured something
    assert all(row["passed"] for row in rows if row["passed"] is not None)
    roofline_rows = [row for row in rows if row["unit"] in ("tok/s", "out tok/s") and row["ceiling"] is not None]
    assert roofline_rows and all(row["ceiling"] > 0 and row["fraction"] > 0 for row in roofline_rows)


def test_cpu_mode_prints_one_table_and_its_metadata(suite_run) -> None:
    result, table = suite_run
    meta = table["meta"]
    assert meta["device"].startswith("cpu") and meta["quantization"] == "none" and meta["kernels"] == "cpu"
    assert "SmolLM2-135M shape, 2 layers" in meta["model"]
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario"))
    assert [cell.strip() for cell in lines[header].split(" | ")] == [
        "scenario", "measured", "unit", "ceiling / target", "fraction"]
    body = lines[header + 2:]
    assert [line.split(" | ")[0].rstrip() for line in body] == [row["scenario"] for row in table["rows"]]


@pytest.fixture
def gpusuite(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from gpusuite import adapters, peer

    return adapters, peer


def tiny_config(tied: bool):
    from loraloom.engine.config import ModelConfig

    return ModelConfig(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=4096,
        tie_word_embeddings=tied,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 256},
    )


PROMPT = [5 + 7 * i % 300 for i in range(300)]  # long enough for the llama3 rope scaling to matter


def engine_tokens(engine, requests: dict) -> dict[str, list[int]]:
    from loraloom.engine.request import SamplingParams

    for name, adapter in requests.items():
        engine.add_request(name, PROMPT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), adapter)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.token_ids)
    return tokens


def peer_with_adapter(gpusuite, directory: Path, config):
    """A rank-8 random adapter "a" for `config` written to `directory`, and the HF+PEFT peer (seed 3) with it."""
    adapters, peer = gpusuite
    from loraloom.engine.lora.handle import AdapterHandle

    path = adapters.write_random_adapter(directory, config, rank=8, seed=1, dtype=torch.float32, device="cpu")
    handle = AdapterHandle(key="a", name="a", uri=path.as_uri())
    return handle, peer.build_peer(config, torch.float32, torch.device("cpu"), seed=3, adapters=[handle])


def test_the_peer_computes_what_the_engine_computes(gpusuite, tmp_path) -> None:
    """Same random weights and adapter file in HF+PEFT and in loraloom: same greedy tokens, base and adapter."""
    _, peer = gpusuite
    from loraloom.engine.config import EngineConfig
    from loraloom.engine.llm_engine import LLMEngine
    from loraloom.engine.model.random_model import random_model

    config = tiny_config(tied=False)
    handle, model = peer_with_adapter(gpusuite, tmp_path / "a", config)
    engine = LLMEngine.from_model(random_model(config, torch.float32, "cpu", seed=3),
                                  EngineConfig(max_loras=1, max_lora_rank=8))
    ours = engine_tokens(engine, {"base": None, "a": handle})
    assert peer.generate(model, [PROMPT], [peer.BASE_ADAPTER_NAME], 6)[0].tolist() == ours["base"]
    assert peer.generate(model, [PROMPT], ["a"], 6)[0].tolist() == ours["a"]
    assert ours["a"] != ours["base"]  # the adapter matters, so agreeing on it means something


def test_the_peer_of_a_tied_model_reads_the_embedding_as_lm_head(gpusuite, tmp_path) -> None:
    _, peer = gpusuite
    from loraloom.engine.config import EngineConfig
    from loraloom.engine.llm_engine import LLMEngine
    from loraloom.engine.model.random_model import random_model

    config = tiny_config(tied=True)
    _, model = peer_with_adapter(gpusuite, tmp_path / "a", config)
    ours = random_model(config, torch.float32, "cpu", seed=3)
    assert torch.equal(model.get_output_embeddings().weight, ours.embed_tokens.weight)
    expected = engine_tokens(LLMEngine.from_model(ours, EngineConfig()), {"base": None})["base"]
    assert peer.generate(model, [PROMPT], [peer.BASE_ADAPTER_NAME], 6)[0].tolist() == expected
