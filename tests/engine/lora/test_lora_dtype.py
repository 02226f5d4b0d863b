"""EngineConfig.lora_dtype: the adapter slots' dtype, on the bundled model.

A 16-bit pool holds the same adapters in half the bytes. For an adapter whose weights are already
bfloat16 and whose PEFT scale is a power of two, the rounding at load changes nothing, so the
engine must generate what the float32 pool generates. With "auto", the float32 pool keeps such an
adapter in a slot of its own 16-bit dtype, and must still generate exactly what float32 slots do.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lora_factory import make_peft_adapter
from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.lora.weights import load_adapter_weights
from loraloom.kernels.lora_stacks import WEIGHT_TYPE_CODES
from loraloom.engine.request import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
QUESTIONS = ["What is the capital of Italy?", "Name a fruit that is yellow.", "Why is the sea salty?"]


def saved_adapter(model_dir: Path, out_dir: Path, seed: int, target_modules: list[str],
                  saved_as: torch.dtype = torch.bfloat16, rank: int = 8, alpha: float = 16,
                  use_rslora: bool = False) -> AdapterHandle:
    """A PEFT adapter saved in `saved_as`; with the default scale alpha / r = 2, a slot of that dtype holds it
    exactly."""
    path = make_peft_adapter(model_dir, out_dir, rank=rank, alpha=alpha, target_modules=target_modules, seed=seed,
                             use_rslora=use_rslora, saved_as=saved_as)
    return AdapterHandle(key=f"{out_dir.name}@test", name=out_dir.name, uri=path.as_uri())


def generate(engine: LLMEngine, adapters: list[AdapterHandle | None]) -> list[list[int]]:
    outputs: dict[str, list[int]] = {}
    for i, (question, adapter) in enumerate(zip(QUESTIONS, adapters)):
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": question}])
        engine.add_request(str(i), prompt, GREEDY, adapter)
        outputs[str(i)] = []
    while engine.has_unfinished():
        for output in engine.step():
            outputs[output.request_id].extend(output.token_ids)
    return list(outputs.values())


def test_bfloat16_slots_generate_what_float32_slots_do_for_a_bfloat16_adapter(model_dir, tmp_path) -> None:
    adapters = [saved_adapter(model_dir, tmp_path / "attention", 11, ["q_proj", "v_proj", "o_proj"]),
                saved_adapter(model_dir, tmp_path / "mlp", 12, ["gate_proj", "down_proj"]), None]
    runs, pools = {}, {}
    for lora_dtype in ("auto", "bfloat16"):
        engine = LLMEngine(model_dir, EngineConfig(max_loras=2, max_lora_rank=8, lora_dtype=lora_dtype))
        runs[lora_dtype] = generate(engine, adapters)
        pools[lora_dtype] = engine.runner.lora_pool
    assert {tensor.dtype for tensor in pools["bfloat16"].tensors()} == {torch.bfloat16}
    assert pools["bfloat16"].nbytes * 2 == pools["auto"].nbytes
    assert runs["bfloat16"] == runs["auto"]
    base_only = LLMEngine(model_dir, EngineConfig(max_loras=2, max_lora_rank=8))
    assert generate(base_only, [None, None, None])[:2] != runs["auto"][:2]  # the adapters change the output


def test_auto_keeps_each_adapter_in_the_narrowest_dtype_that_holds_it_exactly(model_dir, tmp_path) -> None:
    """bfloat16 and float16 adapters in 16-bit slots of the float32 pool, a float32 one in a float32 slot,
    all in one batch: the tokens of a pool that stores every adapter in float32."""
    adapters = [saved_adapter(model_dir, tmp_path / "bf16", 13, ["q_proj", "k_proj", "v_proj", "o_proj"]),
                saved_adapter(model_dir, tmp_path / "fp16", 14, ["gate_proj", "up_proj", "down_proj"],
                             saved_as=torch.float16, rank=16, alpha=16),
                saved_adapter(model_dir, tmp_path / "fp32", 15, ["q_proj", "down_proj"], saved_as=torch.float32)]
    runs, pools = {}, {}
    for lora_dtype in ("auto", "float32"):
        engine = LLMEngine(model_dir, EngineConfig(max_loras=3, max_lora_rank=16, lora_dtype=lora_dtype))
        runs[lora_dtype] = generate(engine, adapters)
        pools[lora_dtype] = engine.runner.lora_pool
    config = ModelConfig.from_dir(model_dir)
    weights = [load_adapter_weights(tmp_path / adapter.name, config, max_rank=16) for adapter in adapters]
    assert [w.exact_dtype for w in weights] == [torch.bfloat16, torch.float16, torch.float32]
    assert [pools["auto"].storage_dtype(w) for w in weights] == [torch.bfloat16, torch.float16, torch.float32]
    assert [pools["float32"].storage_dtype(w) for w in weights] == [torch.float32] * 3
    qkv_types = pools["auto"].stacks[0]["self_attn.qkv_proj"].slot_types.tolist()
    assert sorted(qkv_types) == sorted(WEIGHT_TYPE_CODES[dtype] for dtype in (torch.bfloat16, torch.float16,
                                                                               torch.float32))
    assert runs["auto"] == runs["float32"]


def test_exact_dtype_is_float32_when_the_scaling_rounds(model_dir, tmp_path) -> None:
    """alpha / r = 1.5 times bfloat16 weights needs more than bfloat16's 8 bits of mantissa; rsLoRA's
    alpha / sqrt(r) times them needs more than either 16-bit type holds."""
    config = ModelConfig.from_dir(model_dir)
    saved_adapter(model_dir, tmp_path / "odd", 16, ["v_proj"], alpha=12)
    assert load_adapter_weights(tmp_path / "odd", config, max_rank=8).exact_dtype != torch.bfloat16
    saved_adapter(model_dir, tmp_path / "rslora", 17, ["v_proj"], use_rslora=True)
    assert load_adapter_weights(tmp_path / "rslora", config, max_rank=8).exact_dtype == torch.float32


def test_lora_dtype_is_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"^EngineConfig.lora_dtype is 'int8'; use one of \['auto', 'float32'"):
        EngineConfig(lora_dtype="int8")
    with pytest.raises(ValueError, match=r"EngineConfig.lora_dtype is 'float32' on cuda.*use 'auto'"):
        EngineConfig(device="cuda", dtype="bfloat16", lora_dtype="float32")
    assert EngineConfig(device="cuda", dtype="bfloat16", lora_dtype="bfloat16").resolved_lora_dtype == "bfloat16"
    assert EngineConfig(lora_dtype="auto").resolved_lora_dtype == "float32"
    assert EngineConfig(lora_dtype="float16").resolved_lora_dtype == "float16"
