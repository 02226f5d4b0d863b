"""Fixtures shared by the whole suite: the bundled model and a tiny random Llama checkpoint."""
from __future__ import annotations

import ctypes
import gc
import json
from pathlib import Path

import pytest
import torch


def _glibc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except OSError:  # not glibc: nothing to hand back this way
        return None


_MALLOC_TRIM = _glibc_malloc_trim()


@pytest.fixture(scope="module", autouse=True)
def hand_memory_back_after_each_module():
    """After a module's own fixtures are torn down (this one, set up first, ends last): the memory its
    engines and servers freed goes back to the OS. glibc keeps freed heap memory for reuse, and a group
    of modules that each start an engine grew to ~10 GiB although no engine outlived its module; with
    this, ~1.2 GiB between modules (which lets three groups run side by side on a 24 GiB machine)."""
    yield
    if _MALLOC_TRIM is not None:
        gc.collect()
        _MALLOC_TRIM(0)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct checkpoint (converted once into the cache)."""
    from loraloom.engine.model.bundled import import_bundled

    return import_bundled()


TINY_LLAMA_CONFIG = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    initializer_range=0.2,  # large enough that attention patterns and logits are far from uniform
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A random 2-layer Llama with llama3 RoPE scaling and an untied lm_head, saved by hand as
    two safetensors shards plus model.safetensors.index.json. Read-only: copy it to modify it."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    config = LlamaConfig(**TINY_LLAMA_CONFIG)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initializes norm weights to 1, which would hide a mis-mapped norm
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    config.save_pretrained(directory)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file_name, shard_names in shards.items():
        save_file({name: state[name] for name in shard_names}, str(directory / file_name), metadata={"format": "pt"})
        weight_map.update({name: file_name for name in shard_names})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_llama_dir, model_dir, tmp_path_factory) -> Path:
    """The tiny random Llama checkpoint plus the bundled tokenizer files: a complete, fast checkpoint dir.
    Read-only, like tiny_llama_dir."""
    import shutil

    directory = tmp_path_factory.mktemp("tiny_checkpoint") / "tiny"
    shutil.copytree(tiny_llama_dir, directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, directory / name)
    return directory
