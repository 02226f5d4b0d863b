"""Real PEFT LoRA adapters for tests, made with the `peft` library on the Hugging Face model.

PEFT initializes lora_B to zero (an adapter that changes nothing), so the
weights are overwritten with seeded random values large enough to change
greedy outputs. The base model is loaded once per process and per directory,
and each adapter is made on a deep copy of it: PEFT rewires modules in place
(and unties tied embeddings for modules_to_save), so unloading does not
reliably give the original model back.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch

DEFAULT_INIT_SCALE = 0.05


@functools.lru_cache(maxsize=2)
def hf_base_model(model_dir: Path):
    """The Hugging Face model of `model_dir` in float32, loaded once per process (loading takes seconds)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def make_peft_adapter(
    model_dir: Path,
    out_dir: Path,
    rank: int,
    alpha: float,
    target_modules: list[str] | str,
    seed: int,
    use_rslora: bool = False,
    init_scale: float = DEFAULT_INIT_SCALE,
    rank_pattern: dict[str, int] | None = None,
    alpha_pattern: dict[str, float] | None = None,
    modules_to_save: list[str] | None = None,
    safe_serialization: bool = True,
    saved_as: torch.dtype | None = None,
    layers_to_transform: list[int] | None = None,
) -> Path:
    """Save a PEFT LoRA adapter for the model in `model_dir` to `out_dir`; return out_dir (absolute).

    Every LoRA weight (and every modules_to_save copy) is drawn from N(0, init_scale^2)
    with a generator seeded by `seed`, so the same arguments give the same adapter.
    `target_modules` may be one regular expression, as PEFT allows. `saved_as`: the dtype its safetensors file stores (default: PEFT's, float32), as an adapter
    trained or published in bfloat16 or float16 is saved.
    """
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(hf_base_model(Path(model_dir).resolve()))
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        layers_to_transform=layers_to_transform,
        use_rslora=use_rslora,
        rank_pattern=dict(rank_pattern or {}),
        alpha_pattern=dict(alpha_pattern or {}),
        modules_to_save=modules_to_save,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * init_scale)
    out_dir = Path(out_dir).resolve()
    peft_model.save_pretrained(out_dir, safe_serialization=safe_serialization)
    if saved_as is not None:
        from safetensors.torch import load_file, save_file

        weights = out_dir / "adapter_model.safetensors"
        save_file({name: tensor.to(saved_as) for name, tensor in load_file(weights).items()}, weights)
    return out_dir
