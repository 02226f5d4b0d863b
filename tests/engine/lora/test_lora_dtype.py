"""EngineConfig.lora_dtype: the adapter slots' dtype, on the bundled model.

A 16-bit pool holds the same adapters in half the bytes. For an adapter whose weights are already
bfloat16 and whose PEFT scale is a power of two, the rounding at load changes nothing, so the
engine must generate what the float32 pool generates.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora_factory import make_peft_adapter
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.request import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
QUESTIONS = ["What is the capital of Italy?", "Name a fruit that is yellow.", "Why is the sea salty?"]


def bf16_adapter(model_dir: Path, out_dir: Path, seed: int, target_modules: list[str]) -> AdapterHandle:
    """A PEFT adapter saved in bfloat16 with scale alpha / r = 2, so bfloat16 slots hold it exactly."""
    path = make_peft_adapter(model_dir, out_dir, rank=8, alpha=16, target_modules=target_modules, seed=seed)
    weights_file = path / "adapter_model.safetensors"
    save_file({name: tensor.to(torch.bfloat16) for name, tensor in load_file(weights_file).items()}, weights_file)
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
    adapters = [bf16_adapter(model_dir, tmp_path / "attention", 11, ["q_proj", "v_proj", "o_proj"]),
                bf16_adapter(model_dir, tmp_path / "mlp", 12, ["gate_proj", "down_proj"]), None]
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


def test_lora_dtype_is_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"^EngineConfig.lora_dtype is 'int8'; use one of \['auto', 'float32'"):
        EngineConfig(lora_dtype="int8")
    with pytest.raises(ValueError, match=r"EngineConfig.lora_dtype is 'float32' on cuda.*use 'auto'"):
        EngineConfig(device="cuda", dtype="bfloat16", lora_dtype="float32")
    assert EngineConfig(device="cuda", dtype="bfloat16", lora_dtype="bfloat16").resolved_lora_dtype == "bfloat16"
    assert EngineConfig(lora_dtype="auto").resolved_lora_dtype == "float32"
    assert EngineConfig(lora_dtype="float16").resolved_lora_dtype == "float16"
