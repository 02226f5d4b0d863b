"""A tiny random Llama with the bundled model's tokenizer and chat template: a base that real
jobs (chat datasets, the runner, `loraloom worker` and `serve`) train on in seconds, where the
bundled model takes minutes on two CPU cores."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY_BASE_NAME = "tiny-base"  # a job's `model` must equal the served base directory's name
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
# Every token id of the bundled tokenizer must have an embedding, so the vocabulary is the bundled one.
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True)


def make_tiny_base(parent: Path, bundled_dir: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = parent / TINY_BASE_NAME
    bundled = json.loads((bundled_dir / "config.json").read_text())
    config = LlamaConfig(vocab_size=bundled["vocab_size"], bos_token_id=bundled["bos_token_id"],
                         eos_token_id=bundled["eos_token_id"], **SIZES)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (bundled_dir / name).is_file():
            shutil.copy(bundled_dir / name, directory / name)
    return directory
