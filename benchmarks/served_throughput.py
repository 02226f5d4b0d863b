"""Served throughput: `loraloom serve` over HTTP, as users run it, in one run.

Prints:
1. adapters / base at batch 1, 8 and 32: the same chats sent concurrently with distinct adapters
   (ranks 4-64, different module subsets, all on one server) and on the base model, alternated;
   beside each, the LoRA weights a decode step of that batch reads against the base model's (where
   decode is bound by memory, their proportion bounds the ratio);
2. a realistic mixed workload (40 concurrent chats over 8 adapters, budgets 16-256 tokens, a third
   behind a long shared system prompt) against HF transformers + PEFT's static batch (useful
   tokens only) and against the engine driven directly in this process (no HTTP);
3. the machine's ceiling: a plain HF forward decoding at each batch size.

    python benchmarks/served_throughput.py [--quick] [--skip-peer] [--rounds 2] [--lora-dtype bfloat16]
                                           [--adapters-saved-as bfloat16] [--ranks 2 40 64] [--modules k,up mlp]

--ranks and --modules replace the default adapter mix with one of your own (held-out adapters).

Not a test: figures go to BENCHMARKS.md with the machine's load.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from served.peers import engine_direct, hf_peft_static_batch, plain_forward_ceiling  # noqa: E402
from served.server import running_server, send_batch  # noqa: E402
from served.workload import (SAVED_DTYPES, add_adapter_mix_arguments, base_linear_weights,  # noqa: E402
                             lora_weights_per_decode_step, mixed_requests, specs_from_args, uniform_requests,
                             write_adapters)

from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.engine.config import LORA_DTYPES, EngineConfig  # noqa: E402

BATCHES = (1, 8, 32)
MIXED_REQUESTS, MIXED_ADAPTERS = 40, 8


def ratio_rows(server, names: list[str], batches, new_tokens: int, rounds: int) -> list[tuple[int, float, float]]:
    """(batch, adapters tok/s, base tok/s): each round sends the batch on distinct adapters, then on the
    base model, the same prompts and budgets (ignore_eos, so both generate the same number of tokens)."""
    rows = []
    for batch in batches:
        with_adapters = uniform_requests(batch, names[:batch], new_tokens, seed=batch)
        on_base = uniform_requests(batch, [None], new_tokens, seed=batch)
        # Warm: every adapter of the batch loaded into a slot once, so first loads are not measured.
        send_batch(server, [dataclasses.replace(request, max_tokens=1) for request in with_adapters], ignore_eos=True)
        totals = {"adapters": [0.0, 0], "base": [0.0, 0]}
        for _ in range(rounds):
            for label, requests in (("adapters", with_adapters), ("base", on_base)):
                result = send_batch(server, requests, ignore_eos=True)
                totals[label][0] += result.seconds
                totals[label][1] += result.completion_tokens
        rows.append((batch, totals["adapters"][1] / totals["adapters"][0], totals["base"][1] / totals["base"][0]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="batches 1 and 8, 16 new tokens, one round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--skip-peer", action="store_true", help="leave out HF+PEFT and the plain-forward ceiling")
    parser.add_argument("--lora-dtype", choices=LORA_DTYPES, default="auto",
                        help="the server's (and the direct engine's) adapter slot dtype")
    parser.add_argument("--adapters-saved-as", choices=SAVED_DTYPES, default="float32",
                        help="the dtype the adapters' weights are saved in (their scaling alpha / r is 2)")
    parser.add_argument("--adapter-cache", type=Path, default=None,
                        help="directory to keep the generated adapters in between runs")
    add_adapter_mix_arguments(parser)
    args = parser.parse_args()
    batches = (1, 8) if args.quick else BATCHES
    rounds, new_tokens = (1, 16) if args.quick else (args.rounds, args.new_tokens)
    model_dir = import_bundled()
    specs = specs_from_args(args, max(batches))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    print("adapters: " + ", ".join(f"{s.name} ({'+'.join(m.removesuffix('_proj') for m in s.modules)})"
                                   for s in specs[:MIXED_ADAPTERS])
          + f", ... ({len(specs)} in all), saved in {args.adapters_saved_as}")
    with tempfile.TemporaryDirectory() as tmp:
        adapter_root = args.adapter_cache or Path(tmp) / "adapters"
        write_adapters(model_dir, adapter_root, specs, args.adapters_saved_as)
        names = [spec.name for spec in specs]
        config = EngineConfig(max_loras=len(specs), max_lora_rank=max(spec.rank for spec in specs),
                              lora_dtype=args.lora_dtype)
        serve_args = ["--adapter-dir", str(adapter_root), "--max-loras", str(config.max_loras),
                      "--max-lora-rank", str(config.max_lora_rank), "--lora-dtype", config.lora_dtype]
        mixed = mixed_requests(MIXED_REQUESTS, names[:MIXED_ADAPTERS], seed=7)
        with running_server(Path(tmp) / "data", serve_args, Path(tmp) / "serve.log") as server:
            print(f"\n1. served adapters / base, same chats, {new_tokens} new tokens each, {rounds} round(s)")
            model_config = json.loads((model_dir / "config.json").read_text())
            weight_bytes = 4 if config.lora_dtype == "float32" or (config.lora_dtype == "auto" and
                                                                  args.adapters_saved_as == "float32") else 2
            base_mb = 4 * base_linear_weights(model_config) / 1e6  # the CPU engine holds the base in float32
            for batch, adapters, base in ratio_rows(server, names, batches, new_tokens, rounds):
                # What bounds the ratio where decode is bound by memory: the adapters' bytes against the base's.
                lora_mb = weight_bytes * lora_weights_per_decode_step(model_config, specs[:batch]) / 1e6
                print(f"   batch {batch:>2}: adapters {adapters:6.1f} tok/s, base {base:6.1f} tok/s, "
                      f"ratio {adapters / base:.2f} (target >= 0.90); a decode step reads {lora_mb:.1f} MB "
                      f"of LoRA weights beside {base_mb:.0f} MB of base weights")
            first_per_adapter = {request.adapter: request for request in reversed(mixed)}
            send_batch(server, list(first_per_adapter.values()))  # every adapter of the mix loaded once, as warm
            served = send_batch(server, mixed)
        print(f"\n2. mixed workload: {len(mixed)} chats, {MIXED_ADAPTERS} adapters, budgets 16-256, a third "
              "behind a long shared system prompt")
        print(f"   loraloom served (HTTP): {served.completion_tokens} tokens in {served.seconds:.1f} s = "
              f"{served.tokens_per_s:.1f} tok/s")
        direct_s, direct_tokens = engine_direct(model_dir, config, adapter_root, mixed)
        direct = direct_tokens / direct_s
        print(f"   loraloom engine direct: {direct_tokens} tokens in {direct_s:.1f} s = {direct:.1f} tok/s; "
              f"served / direct {served.tokens_per_s / direct:.2f} (target >= 0.90)")
        if not args.skip_peer:
            peer_s, peer_tokens, peer_texts = hf_peft_static_batch(model_dir, adapter_root, mixed)
            peer = peer_tokens / peer_s
            same = sum(a == b for a, b in zip(served.texts, peer_texts))
            print(f"   HF+PEFT static batch:   {peer_tokens} useful tokens in {peer_s:.1f} s = {peer:.1f} tok/s; "
                  f"served / peer {served.tokens_per_s / peer:.2f}x (target >= 3x); "
                  f"{same}/{len(mixed)} answers identical")
            print("\n3. ceiling: plain HF forward decode, no adapter")
            for batch in batches:
                print(f"   batch {batch:>2}: {plain_forward_ceiling(model_dir, batch):6.1f} tok/s")
    print(f"\nload average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
