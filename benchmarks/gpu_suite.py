"""The GPU benchmark suite: kernel checks, device ceilings, serving scenarios and the HF+PEFT peer, one table.

    python benchmarks/gpu_suite.py                  # on the GPU: Llama-3.1-8B shape, FP8, the issue's sizes
    python benchmarks/gpu_suite.py --cpu-small      # on a CPU: the bundled model's shape, small sizes (CI)
    python benchmarks/gpu_suite.py --scenarios batch1,ttft --json out.json
    python benchmarks/gpu_suite.py --scenarios mixed --dry-run   # on a CPU: arguments, imports, memory fit

Runs from the repository root without `pip install` (benchmarks/_loraloom_shim.py) and needs
only torch, triton, safetensors, tokenizers, transformers and peft. The model has seeded random
weights made on the device; nothing is downloaded. In order:

1. every kernel of the device's backend against kernels/reference.py (stops here on a failure);
2. the device's copy bandwidth and BF16 / FP8 matrix rates;
3. the scenarios (--scenarios picks some): kernels (timed kernels), batch1, concurrency, mixed,
   offline, ttft, cold_load, zipf, peer;
4. the table: each figure next to its ceiling (measured in step 2, or the roofline of
   gpusuite/roofline.py for engine figures) and the issue's target on a GPU.
Progress goes to stderr, the table to stdout; exit status 1 when a kernel check fails.

--dry-run touches no GPU: it parses the arguments, and checks on paper that every engine the
selected scenarios build fits on the smallest GPU lent (gpusuite/fit.py) and runs as many requests
at once as its scenarios need; benchmarks/gpu_checklist.sh --dry-run runs it for every step.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import _loraloom_shim

_loraloom_shim.use_source_tree()

import torch  # noqa: E402

from gpusuite import kernel_checks, peer  # noqa: E402
from gpusuite.ceilings import measure_ceilings  # noqa: E402
from gpusuite.fit import EngineSize, engine_fit  # noqa: E402
from gpusuite.roofline import Roofline  # noqa: E402
from gpusuite.scenarios import (  # noqa: E402
    ADAPTER_RANK,
    AdapterStore,
    Setup,
    batch1_rows,
    build_engine,
    cold_load_rows,
    concurrency_rows,
    decode_tokens_held,
    log,
    offline_rows,
    ttft_rows,
    zipf_rows,
)
from gpusuite.shapes import CPU_SMALL_SIZES, GPU_SIZES, LLAMA_3_1_8B, SMOLLM2_135M, Sizes  # noqa: E402
from gpusuite.table import Row, format_table, write_json  # noqa: E402
from loraloom.engine.config import ModelConfig  # noqa: E402
from loraloom.kernels.backend import get_backend  # noqa: E402

SCENARIOS = ("kernels", "batch1", "concurrency", "mixed", "offline", "ttft", "cold_load", "zipf", "peer")
RANK16_SCENARIOS = ("batch1", "concurrency", "offline", "ttft", "cold_load")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--cpu-small", action="store_true",
                        help="the CPU mode: the bundled model's shape and small sizes, on the CPU")
    parser.add_argument("--quantization", choices=("none", "fp8"),
                        help="base model quantization (default: fp8 on CUDA, none on CPU)")
    parser.add_argument("--fp8-activation-terms", type=int, choices=(1, 2), default=2,
                        help="with fp8: e4m3 terms per token of the projections' activations (EngineConfig)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)} (checks and ceilings always run)")
    parser.add_argument("--json", type=Path, help="also write the table and run metadata to this JSON file")
    parser.add_argument("--num-layers", type=int,
                        help="keep the model's shape but with this many decoder layers (CI uses 2 to stay fast)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true",
                        help="touch no GPU: check the arguments and that the selected scenarios' engines fit")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"--scenarios: unknown {sorted(unknown)}; choose from {','.join(SCENARIOS)}")
    return args


def commit() -> str:
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return result.stdout.strip()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def free_device_memory(device: torch.device) -> None:
    """Return a dropped engine's memory before the next one is built."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def engine_sizes(sizes: Sizes, selected: set[str]) -> dict[str, EngineSize]:
    """The engines the selected scenarios build, one per group of scenarios."""
    engines = {}
    if selected & set(RANK16_SCENARIOS):
        engines["rank16"] = EngineSize(sizes.num_adapters, ADAPTER_RANK, sizes.offline_max_requests)
    if "mixed" in selected:
        engines["mixed"] = EngineSize(sizes.num_adapters, max(sizes.mixed_ranks), max(sizes.concurrency))
    if "zipf" in selected:
        engines["zipf"] = EngineSize(sizes.zipf_slots, ADAPTER_RANK, max(sizes.concurrency))
    return engines


def held_at_once(sizes: Sizes, group: str, selected: set[str]) -> tuple[int, int]:
    """(requests, KV tokens each) an engine's scenarios need resident together, the most of: all the
    concurrent decodes, the cold load's background decodes (at least their timed steps' worth), one
    request of the batch-1 context. Offline and Zipf admit what the KV cache holds."""
    needs = [(1, sizes.context + sizes.decode_steps)]
    if (group == "rank16" and "concurrency" in selected) or group == "mixed":
        needs.append((max(sizes.concurrency), decode_tokens_held(sizes)))
    if group == "rank16" and "cold_load" in selected:
        needs.append((sizes.cold_load_background, decode_tokens_held(sizes)))
    return max(needs, key=lambda need: need[0] * need[1])


def run_scenarios(setup: Setup, selected: set[str]) -> list[Row]:
    rows: list[Row] = []
    ours: dict[str, float] = {}
    base_rates: dict[int, float] = {}
    engines = engine_sizes(setup.sizes, selected)
    if "rank16" in engines:
        engine = build_engine(setup, **dataclasses.asdict(engines["rank16"]))
        if "batch1" in selected:
            batch1, rates = batch1_rows(engine, setup)
            rows += batch1
            ours.update({peer.BATCH1_BASE: rates["base"], peer.BATCH1_ADAPTER: rates["adapter"]})
        if "concurrency" in selected:
            base, base_rates = concurrency_rows(engine, setup, "base only", (), {})
            distinct, distinct_rates = concurrency_rows(
                engine, setup, f"{setup.sizes.num_adapters} adapters r{ADAPTER_RANK}", (ADAPTER_RANK,), base_rates)
            rows += base + distinct
            ours[peer.MULTI_ADAPTER] = distinct_rates[setup.sizes.concurrency[0]]
        if "offline" in selected:
            rows += offline_rows(engine, setup)
        if "ttft" in selected:
            rows += ttft_rows(engine, setup)
        if "cold_load" in selected:
            rows += cold_load_rows(engine, setup)
        del engine
        free_device_memory(setup.device)
    if "mixed" in engines:
        ranks = setup.sizes.mixed_ranks
        engine = build_engine(setup, **dataclasses.asdict(engines["mixed"]))
        label = f"{setup.sizes.num_adapters} adapters, ranks {'/'.join(map(str, ranks))}"
        rows += concurrency_rows(engine, setup, label, ranks, base_rates)[0]
        del engine
        free_device_memory(setup.device)
    if "zipf" in engines:
        engine = build_engine(setup, **dataclasses.asdict(engines["zipf"]))
        rows += zipf_rows(engine, setup)
        del engine
        free_device_memory(setup.device)
    if "peer" in selected:
        log("peer: building Hugging Face transformers + PEFT on the same weights")
        handles = [setup.adapters.handle(ADAPTER_RANK, i) for i in range(setup.sizes.num_adapters)]
        model = peer.build_peer(setup.model_config, setup.dtype, setup.device, setup.seed, handles)
        line = Roofline.of(setup.model_config, setup.dtype, setup.ceilings)
        rows += peer.peer_rows(model, line, setup, handles, ADAPTER_RANK, ours)
        del model
        free_device_memory(setup.device)
    return rows


def model_and_sizes(args: argparse.Namespace) -> tuple[str, ModelConfig, Sizes]:
    model_name, model_config, sizes = (("SmolLM2-135M", SMOLLM2_135M, CPU_SMALL_SIZES) if args.cpu_small
                                       else ("Llama-3.1-8B", LLAMA_3_1_8B, GPU_SIZES))
    if args.num_layers is not None:
        model_config = dataclasses.replace(model_config, num_layers=args.num_layers)
    return model_name, model_config, sizes


def dry_run(argv: list[str]) -> str:
    """What a run with `argv` would build, checked on paper: raises ValueError naming what does not fit."""
    args = parse_args([*argv, "--dry-run"] if "--dry-run" not in argv else argv)
    model_name, model_config, sizes = model_and_sizes(args)
    device_type = "cpu" if args.cpu_small else "cuda"  # what the run picks on the GPU machine
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    quantized = (args.quantization or ("fp8" if device_type == "cuda" else "none")) == "fp8"
    selected = set(args.scenarios.split(","))
    fits = []
    for group, size in engine_sizes(sizes, selected).items():
        requests, tokens_each = held_at_once(sizes, group, selected)
        if requests > size.max_num_seqs:
            raise ValueError(f"engine {group}: its scenarios run {requests} requests at once, max_num_seqs is "
                             f"{size.max_num_seqs}")
        fit = engine_fit(model_config, dtype, quantized, size, requests, tokens_each)
        if not fit.fits:
            raise ValueError(f"engine {group} ({size}) with {requests} x {tokens_each} KV tokens does not fit the "
                             f"smallest GPU lent: {fit.describe()}")
        fits.append(f"{group}: {fit.describe()}")
    return f"{model_name} shape, scenarios {args.scenarios}; " + ("; ".join(fits) or "no engine built")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(dry_run(sys.argv[1:] if argv is None else argv))
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.cpu_small else "cpu"))
    if device.type == "cpu" and not args.cpu_small:
        raise SystemExit("the full sizes (an 8B model) need a GPU; on a CPU pass --cpu-small")
    model_name, model_config, sizes = model_and_sizes(args)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    quantization = args.quantization or ("fp8" if device.type == "cuda" else "none")
    selected = set(args.scenarios.split(","))
    backend = get_backend(device)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "commit": commit(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "torch": torch.__version__,
        "model": f"{model_name} shape, {model_config.num_layers} layers, random weights",
        "dtype": str(dtype).removeprefix("torch."),
        "quantization": (quantization if quantization == "none"
                         else f"{quantization} ({args.fp8_activation_terms}-term activations)"),
        "kernels": backend.name,
        "seed": args.seed,
    }
    log(f"benchmarking the {meta['model']} on {meta['device']}, {meta['quantization']} quantization")

    log("checking kernels against kernels/reference.py")
    rows = kernel_checks.check_all(backend, model_config, sizes.kernel_batch, sizes.kernel_context,
                                   sizes.mixed_ranks, device, quantized=quantization == "fp8")
    failed = [row.scenario for row in rows if row.passed is False]
    if not failed:
        log("measuring the device's ceilings")
        ceilings = measure_ceilings(device, dtype, sizes.copy_bytes, sizes.matmul_size)
        rows += ceilings.rows()
        if "kernels" in selected:
            rows += kernel_checks.timing_rows(backend, model_config, sizes.kernel_batch, sizes.kernel_context,
                                              sizes.context, device, dtype, ceilings, quantization == "fp8")
        with tempfile.TemporaryDirectory(prefix="loraloom-bench-") as adapter_root:
            setup = Setup(
                model_config=model_config,
                sizes=sizes,
                device=device,
                dtype=dtype,
                quantization=None if quantization == "none" else quantization,
                fp8_activation_terms=args.fp8_activation_terms,
                seed=args.seed,
                ceilings=ceilings,
                adapters=AdapterStore(Path(adapter_root), model_config, dtype, device, args.seed),
            )
            rows += run_scenarios(setup, selected)
    print("  ".join(f"{key}: {value}" for key, value in meta.items()))
    print(format_table(rows))
    if args.json is not None:
        write_json(args.json, meta, rows)
    if failed:
        log(f"kernel checks failed: {failed}; nothing was timed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
