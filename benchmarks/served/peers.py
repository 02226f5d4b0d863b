"""What the served figures are compared with, all in the benchmark's own process:

- HF transformers + PEFT generating the same chats as one left-padded static batch with
  `adapter_names` (its multi-adapter batch), counting only each request's useful tokens;
- loraloom's engine driven directly (no HTTP, no event loop) on the same requests;
- the machine's ceiling: a plain HF forward decoding at a given batch size.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from served.workload import ChatRequest

from loraloom.engine.lora.handle import AdapterHandle
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.engine.request import SamplingParams
from loraloom.engine.tokenizer import Tokenizer


def chat_token_ids(model_dir: Path, requests: list[ChatRequest]) -> list[list[int]]:
    """The prompts as the server tokenizes them (the model's chat template, generation prompt added)."""
    tokenizer = Tokenizer.from_dir(model_dir)
    return [tokenizer.encode_chat(request.message_dicts()) for request in requests]


def hf_peft_static_batch(model_dir: Path, adapter_root: Path, requests: list[ChatRequest]) -> tuple[float, int, list[str]]:
    """(seconds, useful tokens, texts): one generate() over all requests, each cut at its budget or EOS."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = sorted({request.adapter for request in requests if request.adapter})
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_root / names[0], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(adapter_root / name, adapter_name=name)
    model.eval()
    prompts = chat_token_ids(model_dir, requests)
    pad = base.config.pad_token_id if base.config.pad_token_id is not None else 0
    eos = base.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                             adapter_names=[request.adapter or "__base__" for request in requests],
                             max_new_tokens=max(request.max_tokens for request in requests), do_sample=False,
                             pad_token_id=pad)
    seconds = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    useful, texts = 0, []
    for row, request in zip(out[:, width:].tolist(), requests):
        kept = row[:request.max_tokens]
        ended = next((i for i, token in enumerate(kept) if token in eos_ids), None)
        if ended is not None:
            kept = kept[:ended + 1]  # the end-of-sequence token is generated work too, as the server counts it
        useful += len(kept)
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return seconds, useful, texts


def local_adapter(adapter_root: Path, name: str) -> AdapterHandle:
    """The handle of the adapter written to adapter_root/<name>, keyed by its name, for the engine itself."""
    return AdapterHandle(key=name, name=name, uri=(adapter_root / name).resolve().as_uri())


def engine_direct(model_dir: Path, config: EngineConfig, adapter_root: Path,
                  requests: list[ChatRequest]) -> tuple[float, int]:
    """(seconds, generated tokens) of LLMEngine stepping the same requests, adapters loaded beforehand
    (as the server had them warm)."""
    engine = LLMEngine(model_dir, config)
    handles = {name: local_adapter(adapter_root, name)
               for name in {request.adapter for request in requests if request.adapter}}
    for handle in handles.values():
        engine.load_adapter(handle)
    prompts = chat_token_ids(model_dir, requests)
    start = time.perf_counter()
    for i, (prompt, request) in enumerate(zip(prompts, requests)):
        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0)
        engine.add_request(f"r{i}", prompt, params, handles.get(request.adapter))
    generated = 0
    while engine.has_unfinished():
        generated += sum(len(output.token_ids) for output in engine.step())
    return time.perf_counter() - start, generated


def plain_forward_ceiling(model_dir: Path, batch: int, new_tokens: int = 32) -> float:
    """Tokens/s of a plain HF forward decoding `batch` sequences (short prompt, KV cache, no adapter)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    input_ids = torch.randint(100, 1000, (batch, 16), generator=torch.Generator().manual_seed(0))
    inputs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=2, min_new_tokens=2)  # warm-up
        start = time.perf_counter()
        model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return batch * new_tokens / (time.perf_counter() - start)
