"""Checkpoint loading: config.json layouts, name mapping and fusion, and loud errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from loraloom.engine.config import ModelConfig
from loraloom.engine.model.loader import checkpoint_files, load_model, load_weights

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def write_config(directory: Path, **rope_keys) -> Path:
    base = {
        "model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**base, **rope_keys}))
    return directory


@pytest.mark.parametrize(
    "rope_keys",
    [
        {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING}},
        {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3_SCALING}},
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING}},
    ],
    ids=["classic", "classic-type-key", "transformers5"],
)
def test_rope_keys_read_from_every_config_layout(tmp_path, rope_keys):
    config = ModelConfig.from_dir(write_config(tmp_path, **rope_keys))
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "llama3", **LLAMA3_SCALING}


@pytest.mark.parametrize(
    "rope_keys",
    [{"rope_theta": 1234.0}, {"rope_theta": 1234.0, "rope_scaling": None},
     {"rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}}],
    ids=["classic", "classic-null-scaling", "transformers5"],
)
def test_plain_rope_has_no_scaling(tmp_path, rope_keys):
    config = ModelConfig.from_dir(write_config(tmp_path, **rope_keys))
    assert (config.rope_theta, config.rope_scaling) == (1234.0, None)


def test_bundled_config(model_dir):
    config = ModelConfig.from_dir(model_dir)
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (576, 30, 9, 3)
    assert (config.head_dim, config.intermediate_size, config.vocab_size) == (64, 1536, 49152)
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert config.tie_word_embeddings


def test_fused_weights_are_the_checkpoint_tensors_concatenated(tiny_llama_dir):
    config = ModelConfig.from_dir(tiny_llama_dir)
    hf = {}
    for path in checkpoint_files(tiny_llama_dir):
        with safe_open(str(path), framework="pt") as shard:
            hf.update({name: shard.get_tensor(name) for name in shard.keys()})
    weights = load_weights(tiny_llama_dir, config)
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        assert torch.equal(
            weights[f"layers.{i}.self_attn.qkv_proj.weight"],
            torch.cat([hf[layer + f"self_attn.{p}_proj.weight"] for p in "qkv"]),
        )
        assert torch.equal(
            weights[f"layers.{i}.mlp.gate_up_proj.weight"],
            torch.cat([hf[layer + "mlp.gate_proj.weight"], hf[layer + "mlp.up_proj.weight"]]),
        )
        assert torch.equal(weights[f"layers.{i}.mlp.down_proj.weight"], hf[layer + "mlp.down_proj.weight"])
    assert torch.equal(weights["lm_head.weight"], hf["lm_head.weight"])
    assert not torch.equal(weights["lm_head.weight"], weights["embed_tokens.weight"])


def test_tied_model_uses_the_embedding_as_output(model_dir):
    model = load_model(model_dir, torch.float32, "cpu")
    assert model.lm_head is None
    embedding = load_file(str(model_dir / "model.safetensors"))["model.embed_tokens.weight"]
    hidden = torch.randn(2, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ embedding.T)


def test_load_model_casts_to_the_requested_dtype(tiny_llama_dir):
    model = load_model(tiny_llama_dir, torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.layers[0].self_attn.qkv_proj.slice_sizes == (64, 32, 32)
    assert model.layers[0].mlp.gate_up_proj.slice_sizes == (160, 160)


def _copy_single_file(tiny_llama_dir: Path, destination: Path, edit) -> Path:
    """The tiny checkpoint re-saved as one model.safetensors after edit(tensors)."""
    destination.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", destination)
    tensors = {}
    for path in checkpoint_files(tiny_llama_dir):
        tensors.update(load_file(str(path)))
    edit(tensors)
    save_file(tensors, str(destination / "model.safetensors"))
    return destination


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
        (lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(16, 64)}),
         "model.layers.0.self_attn.k_proj.weight"),
        (lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}), "q_proj.bias"),
    ],
    ids=["missing", "wrong-shape", "unexpected-bias"],
)
def test_bad_checkpoint_errors_name_the_tensor(tiny_llama_dir, tmp_path, edit, message):
    directory = _copy_single_file(tiny_llama_dir, tmp_path / "ckpt", edit)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load_model(directory, torch.float32, "cpu")


def test_single_file_and_sharded_checkpoints_load_the_same(tiny_llama_dir, tmp_path):
    single = _copy_single_file(tiny_llama_dir, tmp_path / "single", lambda tensors: None)
    config = ModelConfig.from_dir(tiny_llama_dir)
    sharded_weights = load_weights(tiny_llama_dir, config)
    single_weights = load_weights(single, config)
    assert sharded_weights.keys() == single_weights.keys()
    assert all(torch.equal(sharded_weights[name], single_weights[name]) for name in sharded_weights)


def test_missing_files_are_reported(tiny_llama_dir, tmp_path):
    empty = write_config(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        checkpoint_files(empty)
    partial = tmp_path / "partial"
    shutil.copytree(tiny_llama_dir, partial)
    (partial / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        checkpoint_files(partial)
