"""Multi-adapter throughput on CPU: loraloom vs Hugging Face transformers + PEFT, in one run.

Workload (issue 2): 32 chat requests over 8 rank-8 adapters on all seven
modules, prompts of about 40-60 tokens, 64 new tokens each, greedy, fp32.
The peer generates one left-padded batch with `adapter_names` (PEFT's mixed
adapter batches). Also reports host overhead per decode step (scheduler +
batch preparation + sampling, model forward excluded) at 256 running
requests over 64 adapters: benchmarks/host_overhead.py's greedy scenario.

    python benchmarks/cpu_throughput.py [--requests 32] [--adapters 8] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from host_overhead import CPU_STUB_VOCAB, run_scenario, tenant_tags  # noqa: E402
from host_overhead import build_engine as build_overhead_engine  # noqa: E402
from lora_factory import make_peft_adapter  # noqa: E402  (shared with the tests: one adapter factory)
from served.workload import TOPICS  # noqa: E402  (the served benchmark's prompt topics)

from loraloom.engine.lora.handle import AdapterHandle  # noqa: E402
from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.engine.config import EngineConfig  # noqa: E402
from loraloom.engine.llm_engine import LLMEngine  # noqa: E402
from loraloom.engine.request import SamplingParams  # noqa: E402

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def chat_prompts(engine: LLMEngine, count: int, seed: int) -> list[list[int]]:
    """Chat prompts of roughly 40-60 tokens (template included)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        topic = rng.choice(TOPICS)
        detail = rng.choice(["in simple words", "with one example", "briefly, in two sentences", "for a ten year old"])
        messages = [
            {"role": "system", "content": "You are a concise, friendly assistant. Answer accurately, avoid jargon, and keep every answer short."},
            {"role": "user", "content": f"Please explain {topic} {detail}."},
        ]
        prompts.append(engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages), add_special_tokens=False))
    return prompts


def make_adapters(model_dir: Path, root: Path, count: int, rank: int) -> list[AdapterHandle]:
    handles = []
    for i in range(count):
        path = make_peft_adapter(model_dir, root / f"adapter{i}", rank=rank, alpha=2 * rank,
                                 target_modules=ALL_MODULES, seed=1000 + i)
        handles.append(AdapterHandle(key=f"bench{i}", name=f"adapter{i}", uri=path.as_uri()))
    return handles


def run_loraloom(model_dir, prompts, adapters, assignment, new_tokens) -> tuple[float, int]:
    engine = LLMEngine(model_dir, EngineConfig(max_loras=len(adapters), max_lora_rank=16, num_kv_blocks=512))
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for adapter in adapters:
        engine.load_adapter(adapter)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params, adapters[assignment[i]])
    generated = 0
    while engine.has_unfinished():
        generated += len(engine.step())
    return time.perf_counter() - start, generated


def run_peer(model_dir, prompts, adapters, assignment, new_tokens) -> tuple[float, int]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapters[0].uri.removeprefix("file://"), adapter_name=adapters[0].name)
    for adapter in adapters[1:]:
        model.load_adapter(adapter.uri.removeprefix("file://"), adapter_name=adapter.name)
    model.eval()
    pad = base.config.pad_token_id if base.config.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    names = [adapters[assignment[i]].name for i in range(len(prompts))]
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, adapter_names=names,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=pad)
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - width) * len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--overhead-requests", type=int, default=256)
    parser.add_argument("--overhead-adapters", type=int, default=64)
    parser.add_argument("--overhead-steps", type=int, default=20)
    parser.add_argument("--overhead-tenants", type=int, default=16)
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = import_bundled()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        adapters = make_adapters(model_dir, root / "w", args.adapters, rank=8)
        probe = LLMEngine(model_dir, EngineConfig(num_kv_blocks=16))
        prompts = chat_prompts(probe, args.requests, seed=0)
        del probe
        assignment = [i % args.adapters for i in range(args.requests)]
        ours_s, ours_tokens = run_loraloom(model_dir, prompts, adapters, assignment, args.new_tokens)
        ours = ours_tokens / ours_s
        print(f"prompt tokens: min {min(map(len, prompts))} max {max(map(len, prompts))}")
        print(f"loraloom      : {ours_tokens} tokens in {ours_s:.2f} s = {ours:.1f} tokens/s")
        if not args.skip_peer:
            peer_s, peer_tokens = run_peer(model_dir, prompts, adapters, assignment, args.new_tokens)
            peer = peer_tokens / peer_s
            print(f"HF+PEFT       : {peer_tokens} tokens in {peer_s:.2f} s = {peer:.1f} tokens/s")
            print(f"ratio         : {ours / peer:.2f}x (target >= 3x)")
    # benchmarks/host_overhead.py's greedy scenario: the model stubbed out, its logits CPU_STUB_VOCAB wide.
    engine, handles = build_overhead_engine(model_dir, args.overhead_requests, args.overhead_adapters, "cpu",
                                            CPU_STUB_VOCAB)
    overhead = run_scenario(engine, "greedy", args.overhead_requests, handles, warmup=5, steps=args.overhead_steps,
                            tenants=tenant_tags(args.overhead_tenants))
    print(f"decode step at {overhead['running']} running over {args.overhead_adapters} adapters (median ms, "
          f"benchmarks/host_overhead.py greedy): schedule {overhead['schedule']:.2f}, prepare "
          f"{overhead['prepare']:.2f}, sample {overhead['sample']:.2f}, postprocess {overhead['postprocess']:.2f}; "
          f"host overhead total {overhead['host']:.2f} (target <= 1 ms)")


if __name__ == "__main__":
    main()
