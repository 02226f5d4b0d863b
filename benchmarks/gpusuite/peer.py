"""The peer: Hugging Face transformers + PEFT on the very weights and adapter files the engine served.

The Hugging Face model gets the seeded random weights of engine/model/random_model.py (un-fused into
q/k/v and gate/up), unquantized in the engine dtype; the adapters are the same PEFT directories,
loaded with PeftModel.load_adapter. Decode speed is measured as the difference between two
`generate` calls, so the prefill drops out: (N - 1) tokens / (time for N tokens - time for 1).
A mixed-adapter batch uses PEFT's `adapter_names` (one adapter per row).
"""
from __future__ import annotations

import contextlib
import time

import torch

from gpusuite.ceilings import synchronize
from gpusuite.roofline import Roofline
from gpusuite.scenarios import Setup
from gpusuite.table import Row
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.host_cache import local_adapter_dir
from loraloom.engine.config import ModelConfig
from loraloom.engine.model.loader import FUSED_PROJECTIONS
from loraloom.engine.model.llama import LlamaModel
from loraloom.engine.model.random_model import random_model

BASE_ADAPTER_NAME = "__base__"  # PEFT's name for "no adapter" in adapter_names


def hf_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """LlamaModel parameters under Hugging Face LlamaForCausalLM names: the loader's fusing undone.

    Our names are Hugging Face's without the leading "model." (engine/model/loader.py), except that
    the fused projections are split back into their parts by the Linear's slice sizes.
    """
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        module_name = name.removesuffix(".weight")  # e.g. layers.3.self_attn.qkv_proj
        fused = next((key for key in FUSED_PROJECTIONS if module_name.endswith(f".{key}")), None)
        if name == "lm_head.weight":
            state[name] = tensor
        elif fused is None:
            state[f"model.{name}"] = tensor
        else:
            layer_prefix = module_name.removesuffix(fused)  # layers.3.
            pieces = tensor.split(model.get_submodule(module_name).slice_sizes)
            for part, piece in zip(FUSED_PROJECTIONS[fused], pieces):
                state[f"model.{layer_prefix}{part}.weight"] = piece
    if model.lm_head is None:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied
    return state


def hf_config(config: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
    )


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Build Hugging Face modules directly in `dtype` (no fp32 copy of an 8B model first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_peer(config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int,
               adapters: list[AdapterHandle]):
    """LlamaForCausalLM with random_model(seed)'s weights, wrapped by PEFT with `adapters` loaded by name."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    with _default_dtype(dtype), torch.device(device):
        model = LlamaForCausalLM(hf_config(config))
    ours = random_model(config, dtype, device, seed)
    model.load_state_dict(hf_state_dict(ours), strict=True)
    del ours
    model.eval()
    first, *rest = adapters
    peft_model = PeftModel.from_pretrained(model, str(local_adapter_dir(first.uri)), adapter_name=first.key)
    for adapter in rest:
        peft_model.load_adapter(str(local_adapter_dir(adapter.uri)), adapter_name=adapter.key)
    return peft_model.eval()


@torch.inference_mode()
def generate(peer, prompts: list[list[int]], adapter_names: list[str], new_tokens: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts, exactly `new_tokens` tokens each: [B, new_tokens]."""
    device = next(peer.parameters()).device
    input_ids = torch.tensor(prompts, device=device)
    out = peer.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), adapter_names=adapter_names,
                        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    synchronize(device)
    return out[:, input_ids.shape[1]:]


def decode_rate(peer, prompts: list[list[int]], adapter_names: list[str], steps: int) -> float:
    """Decode tokens/s of the batch, prefill excluded."""
    generate(peer, prompts, adapter_names, 2)  # warm-up
    first = _seconds(lambda: generate(peer, prompts, adapter_names, 1))
    full = _seconds(lambda: generate(peer, prompts, adapter_names, steps + 1))
    return len(prompts) * steps / (full - first)


def _seconds(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# Keys of the figures compared with loraloom's own.
BATCH1_BASE, BATCH1_ADAPTER, MULTI_ADAPTER = "batch1_base", "batch1_adapter", "multi_adapter"


def peer_rows(peer, line: Roofline, setup: Setup, adapters: list[AdapterHandle], rank: int,
              ours: dict[str, float]) -> list[Row]:
    """Batch-1 decode (base, one adapter) and a batch of sizes.concurrency[0] rows spread over `adapters`
    (all of rank `rank`), each next to the roofline of the peer's own unquantized weights and, where
    `ours` has the same figure (by key), followed by loraloom's speed-up."""
    sizes = setup.sizes
    batch = sizes.concurrency[0]
    names = [adapters[i % len(adapters)].key for i in range(batch)]
    one_context = [sizes.context + sizes.peer_decode_steps // 2]
    cases = [
        (BATCH1_BASE, "batch-1 decode, base", [sizes.context], [BASE_ADAPTER_NAME], one_context, [0], []),
        (BATCH1_ADAPTER, f"batch-1 decode, 1 adapter r{rank}", [sizes.context], names[:1], one_context, [rank],
         [rank]),
        (MULTI_ADAPTER, f"decode c={batch}, {len(set(names))} adapters r{rank} (adapter_names)",
         [sizes.concurrent_prompt] * batch, names, [sizes.concurrent_prompt + sizes.peer_decode_steps // 2] * batch,
         [rank] * batch, [rank] * len(set(names))),
    ]
    rows = []
    for key, label, prompt_lens, adapter_names, contexts, request_ranks, distinct_ranks in cases:
        prompts = [setup.prompt(length) for length in prompt_lens]
        rate = decode_rate(peer, prompts, adapter_names, sizes.peer_decode_steps)
        ceiling = len(prompts) / line.decode_step_seconds(contexts, request_ranks, distinct_ranks)
        rows.append(Row(f"peer HF+PEFT {label}", rate, "tok/s", ceiling))
        if key in ours:
            rows.append(Row(f"loraloom / peer, {label}", ours[key] / rate, "x peer"))
    return rows
