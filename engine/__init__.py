"""loraloom.engine: the inference runtime (torch only; no web framework, no database).

The names below are the engine's public interface: the platform imports the engine only as
`from loraloom.engine import <name>` (tests/platform/test_layers.py checks it), so what the engine
promises is this list, and everything else is free to move.

Each name is imported from its module on first use, not here. Why: `loraloom.engine` is the parent
of every engine module, so an eager import here would make `import loraloom.engine.scheduler` load
torch and the whole model, and the `loraloom` command would pay for torch just to print its help.
Resolved lazily, each name costs what its own module costs, as a direct import of it would.
"""
from __future__ import annotations

import importlib

_PUBLIC_NAMES: dict[str, tuple[str, ...]] = {
    "async_engine": ("AsyncEngine",),
    "client": ("EngineClient", "EngineFacts", "FactsOfEngineElsewhere"),
    "config": (
        "EngineConfig", "FP8_ACTIVATION_TERMS", "KV_CACHE_DTYPES", "LORA_DTYPES", "ModelConfig", "QUANTIZATION_METHODS",
        "SCHEDULING_POLICIES", "SPECULATION_MODES"),
    "outputs": (
        "AdapterResidency", "EngineStats", "EngineUnavailableError", "RequestFailedError", "RequestOutput", "TokenLogprob"),
    "generation_defaults": ("GENERATION_CONFIG_SOURCES", "GenerationDefaults", "read_generation_defaults"),
    "field_error": ("RequestFieldError",),
    "request": (
        "MAX_LOGIT_BIAS", "MAX_LOGIT_BIAS_TOKENS", "MAX_PENALTY", "MAX_TEMPERATURE", "MAX_TOP_LOGPROBS", "SamplingParams",
    ),
    "metric_labels": ("OTHER_ADAPTERS_LABEL",),
    "request_latency": ("HistogramSnapshot", "merge_histograms", "total_histogram"),
    "structured_output": ("CompiledGrammar",),
    "tenancy": ("DEFAULT_TENANT", "TenantTag"),
    "tokenizer": ("ChatTemplateError", "Tokenizer", "compile_chat_template", "render_chat_template"),
    "torch_threads": ("reserve_for_step_thread",),
    "model.bundled": ("import_bundled",),
    "lora.errors": ("AdapterLoadError",),
    "lora.files": (
        "ADAPTER_CONFIG_FILE", "ADAPTER_FILES", "ADAPTER_WEIGHTS_FILE", "LORA_MODULE_PARENTS", "file_sha256", "runtime_key",
    ),
    "lora.handle": ("AdapterHandle",),
    "lora.host_cache": ("AdapterFetcher", "fetch_local_dir"),
    "lora.weights": (
        "AdapterSummary", "base_model_matches", "inspect_adapter", "largest_adapter_bytes",
        "load_adapter_weights",
    ),
}
_MODULE_OF = {name: module for module, names in _PUBLIC_NAMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
