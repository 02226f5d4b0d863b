"""The gateway reaches a running engine only through EngineClient (engine/client.py), so that the
engine can run in another process (platform/ray_serve). Its other imports from loraloom.engine are
plain data (handles, parameters, outputs, configs) and the adapter-file facts and checks the registry
shares with the engine; the engine's runtime (AsyncEngine) is built only where a process is put
together: the `loraloom serve` command and the Ray Serve engine deployment."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loraloom.engine

PLATFORM = Path(__file__).resolve().parents[2] / "platform"

# Where a process is assembled: these may build an engine.
COMPOSITION_ROOTS = {"cli/serve.py", "ray_serve/engine_deployment.py"}
ENGINE_RUNTIME = {"AsyncEngine"}
# The gateway's request path (the HTTP API and metering) names only the interface and plain data.
GATEWAY_PACKAGES = {"api", "metering"}
GATEWAY_NAMES = {
    "EngineClient", "AdapterHandle", "AdapterLoadError", "AdapterResidency", "ChatTemplateError", "CompiledGrammar",
    "EngineUnavailableError",
    "EngineFacts", "EngineStats", "FactsOfEngineElsewhere", "ModelConfig", "RequestFailedError", "RequestFieldError", "RequestOutput", "SamplingParams",
    "TokenLogprob",
    "TenantTag", "Tokenizer", "ADAPTER_CONFIG_FILE", "ADAPTER_FILES", "ADAPTER_WEIGHTS_FILE",
    # Plain data and pure functions over it: the model's sampling defaults, and latency histograms
    # summed across Ray replicas.
    "GenerationDefaults", "HistogramSnapshot", "merge_histograms",
    # The sampling fields' ranges, which the request schemas check and describe.
    "MAX_LOGIT_BIAS", "MAX_LOGIT_BIAS_TOKENS", "MAX_PENALTY", "MAX_TEMPERATURE", "MAX_TOP_LOGPROBS",
}


def engine_names_imported(path: Path) -> set[str]:
    """Every name the file imports from loraloom.engine, at the top or inside functions."""
    return {
        alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "loraloom.engine"
        for alias in node.names
    }


MODULES = sorted(PLATFORM.rglob("*.py"))


def _id(path: Path) -> str:
    return str(path.relative_to(PLATFORM))


def test_the_allowed_names_exist():
    """A renamed engine name must not leave this test allowing a name nobody can import."""
    assert GATEWAY_NAMES | ENGINE_RUNTIME <= set(loraloom.engine.__all__)


@pytest.mark.parametrize("path", MODULES, ids=_id)
def test_only_composition_roots_build_an_engine(path):
    if _id(path) in COMPOSITION_ROOTS:
        return
    built = engine_names_imported(path) & ENGINE_RUNTIME
    assert not built, (f"platform/{_id(path)} imports {sorted(built)}; the gateway talks to an engine through "
                       "loraloom.engine.EngineClient, handed to create_app")


@pytest.mark.parametrize("path", [p for p in MODULES if _id(p).split("/")[0] in GATEWAY_PACKAGES], ids=_id)
def test_the_gateway_names_only_the_interface_and_plain_data(path):
    extra = engine_names_imported(path) - GATEWAY_NAMES
    assert not extra, f"platform/{_id(path)} imports {sorted(extra)} from loraloom.engine; go through EngineClient"


def test_the_in_process_engine_is_an_engine_client():
    """Every member the interface declares exists on AsyncEngine, callables as callables."""
    from loraloom.engine import AsyncEngine, EngineClient

    methods = {name for name, member in vars(EngineClient).items() if callable(member) and not name.startswith("_")}
    assert {"generate", "stats", "adapter_residency"} <= methods
    for name in methods:
        assert callable(getattr(AsyncEngine, name, None)), f"AsyncEngine lacks EngineClient.{name}"
