"""Tuning sweep of the SGMV kernels: shrink and expand configs at the engine's decode and prefill shapes.

    python benchmarks/gpusuite/sgmv_sweep.py                # on an H100: Llama-3.1-8B shapes, < 3 minutes
    python benchmarks/gpusuite/sgmv_sweep.py --cpu          # tiny shapes under TRITON_INTERPRET (CI smoke test)
    python benchmarks/gpusuite/sgmv_sweep.py --json out.json

For every workload (tokens over adapters, rank 16) and module (qkv, o, gate_up, down), each config
is first checked against kernels/reference.py on the same inputs (a wrong variant is reported
and never timed), then timed with triton.testing.do_bench (median; L2 flushed between calls) and
reported as GB/s of the bytes the op must move:

    shrink: the active adapters' lora_a once, the adapter tokens' x rows, the shrunk output;
    expand: the active adapters' lora_b once, the shrunk input, the adapter rows of the base
            output read and written.

The measured copy bandwidth is printed for scale; the last lines name the best config per shape
and the config with the best geometric mean over all shapes (the candidate default).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Workload:
    name: str
    num_tokens: int
    num_adapters: int  # tokens are spread evenly over this many adapters, in scrambled batch order
    tile_rows: int = 16


@dataclass(frozen=True)
class Module:
    name: str
    in_features: int
    out_features: tuple[int, ...]  # one entry per slice


def llama_modules(hidden: int, kv_width: int, intermediate: int) -> list[Module]:
    return [Module("qkv", hidden, (hidden, kv_width, kv_width)), Module("o", hidden, (hidden,)),
            Module("gate_up", hidden, (intermediate, intermediate)), Module("down", intermediate, (hidden,))]


GPU_WORKLOADS = [Workload("decode 64 tok / 64 adapters", 64, 64), Workload("decode 256 tok / 64 adapters", 256, 64),
                 Workload("prefill 1024 tok / 4 adapters", 1024, 4),
                 Workload("prefill 1024 tok / 4 adapters, 64-row tiles", 1024, 4, tile_rows=64)]
GPU_MODULES = llama_modules(hidden=4096, kv_width=1024, intermediate=14336)
CPU_WORKLOADS = [Workload("decode 8 tok / 8 adapters", 8, 8), Workload("prefill 40 tok / 2 adapters", 40, 2),
                 Workload("prefill 40 tok / 2 adapters, 32-row tiles", 40, 2, tile_rows=32)]
CPU_MODULES = llama_modules(hidden=64, kv_width=16, intermediate=96)
RANK = 16
RELATIVE_TOLERANCE = 2e-2  # bf16 on the GPU, fp16 on the CPU: a few units of the last place


def shrink_configs(sgmv, cpu: bool) -> list:
    config = sgmv.ShrinkConfig
    if cpu:
        return [sgmv.DEFAULT_SHRINK, config(block_k=32, num_warps=2, target_programs=64)]
    variants = [config(block_k=block_k, num_warps=warps, target_programs=target)
                for block_k, warps, target in [(64, 4, 264), (128, 4, 528), (128, 4, 1056), (256, 4, 528),
                                               (256, 4, 1056), (256, 8, 1056), (256, 4, 2112), (512, 8, 1056)]]
    return [sgmv.DEFAULT_SHRINK] + [v for v in variants if v != sgmv.DEFAULT_SHRINK]


def expand_configs(sgmv, cpu: bool) -> list:
    config = sgmv.ExpandConfig
    if cpu:
        return [sgmv.DEFAULT_EXPAND, config(block_n=32, num_warps=2)]
    variants = [config(block_n=block_n, num_warps=warps)
                for block_n, warps in [(64, 4), (128, 4), (256, 4), (256, 8), (512, 4), (512, 8)]]
    return [sgmv.DEFAULT_EXPAND] + [v for v in variants if v != sgmv.DEFAULT_EXPAND]


def config_label(config) -> str:
    return " ".join(f"{key}={value}" for key, value in asdict(config).items() if value is not None)


@dataclass
class Result:
    op: str
    workload: str
    module: str
    config: str
    error: float
    passed: bool
    seconds: float | None  # None: not timed (failed its check)
    bytes_moved: int

    @property
    def gbps(self) -> float | None:
        return None if self.seconds is None else self.bytes_moved / self.seconds / 1e9


def median_seconds(fn, device, torch) -> float:
    """do_bench's median on CUDA (L2 flushed between calls); a plain median of a few calls elsewhere."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median") / 1e3
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def relative_error(actual, expected) -> float:
    expected = expected.float()
    return float((actual.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def run_sweep(cpu: bool) -> tuple[list[Result], float]:
    import torch

    from gpusuite.ceilings import measure_ceilings
    from loraloom.kernels.sgmv_plan import plan_sgmv
    from loraloom.kernels import reference, sgmv

    device = torch.device("cpu" if cpu else "cuda")
    dtype = torch.float16 if cpu else torch.bfloat16  # the interpreter's bf16 tl.dot is unusable
    workloads, modules = (CPU_WORKLOADS, CPU_MODULES) if cpu else (GPU_WORKLOADS, GPU_MODULES)
    copy_bandwidth = measure_ceilings(device, dtype, copy_bytes=1 << (20 if cpu else 30),
                                      matmul_size=64 if cpu else 1024).copy_bandwidth
    item = dtype.itemsize
    results: list[Result] = []
    generator = torch.Generator().manual_seed(0)
    for workload in workloads:
        per_adapter = workload.num_tokens // workload.num_adapters
        slots = [slot for slot in range(workload.num_adapters) for _ in range(per_adapter)]
        order = torch.randperm(len(slots), generator=generator).tolist()
        token_slots = [slots[i] for i in order]
        meta = plan_sgmv(token_slots, [RANK] * workload.num_adapters,
                         tile_rows=workload.tile_rows).to_metadata(device)
        tokens, adapters = len(token_slots), workload.num_adapters
        for module in modules:
            in_features, widths = module.in_features, module.out_features
            offsets = [0]
            for width in widths:
                offsets.append(offsets[-1] + width)
            x = (torch.randn(tokens, in_features, generator=generator) / 4).to(dtype).to(device)
            lora_a = [(torch.randn(adapters, RANK, in_features, generator=generator) / in_features ** 0.5)
                      .to(dtype).to(device) for _ in widths]
            lora_b = [(torch.randn(adapters, width, RANK, generator=generator) / RANK ** 0.5).to(dtype).to(device)
                      for width in widths]
            base = torch.randn(tokens, offsets[-1], generator=generator).to(dtype).to(device)

            shrunk_ref = torch.zeros(len(widths), tokens, RANK, device=device)
            reference.sgmv_shrink(x.float(), [a.float() for a in lora_a], meta, shrunk_ref)
            y = shrunk_ref.to(dtype)
            expand_ref = base.float()
            reference.sgmv_expand(y.float(), [b.float() for b in lora_b], meta, expand_ref, offsets)

            shrink_bytes = (adapters * len(widths) * RANK * in_features + tokens * in_features
                            + len(widths) * tokens * RANK) * item
            expand_bytes = (adapters * RANK * offsets[-1] + len(widths) * tokens * RANK
                            + 2 * tokens * offsets[-1]) * item
            for config in shrink_configs(sgmv, cpu):
                out = torch.zeros(len(widths), tokens, RANK, dtype=dtype, device=device)
                call = lambda: sgmv.sgmv_shrink(x, lora_a, meta, out, config=config)  # noqa: E731
                if fits(call, config):
                    results.append(measure("shrink", workload, module, config, out, shrunk_ref, call, shrink_bytes,
                                           device, torch))
            for config in expand_configs(sgmv, cpu):
                out = base.clone()
                call = lambda: sgmv.sgmv_expand(y, lora_b, meta, out, offsets, config=config)  # noqa: E731
                if fits(call, config):
                    results.append(measure("expand", workload, module, config, out, expand_ref, call, expand_bytes,
                                           device, torch))
            print(f"  {workload.name}, {module.name}: done", file=sys.stderr, flush=True)
    return results, copy_bandwidth


def fits(call, config) -> bool:
    """Run the variant once; a config whose tiles exceed the device's shared memory is skipped, not fatal."""
    from triton.runtime.errors import OutOfResources

    try:
        call()
    except OutOfResources as error:
        print(f"  skipped {config}: {error}", file=sys.stderr, flush=True)
        return False
    return True


def graph_replay_check(torch) -> float:
    """Capture shrink + expand in a CUDA graph with one step's metadata, refresh the static metadata
    buffer with another step's (different segments and tiles, same capacities), replay, and compare
    with the reference on the new metadata: the launch grids must not depend on metadata values."""
    from loraloom.kernels.sgmv_plan import metadata_views, plan_sgmv, segment_capacity, tile_capacity
    from loraloom.kernels import reference, sgmv

    device, dtype = torch.device("cuda"), torch.bfloat16
    tokens, slots, hidden, widths = 64, 16, 512, [512, 128, 128]
    max_segments = segment_capacity(tokens, slots)
    max_tiles = tile_capacity(tokens, max_segments)
    ranks = [8, 16, 32, 64] * (slots // 4)
    generator = torch.Generator().manual_seed(1)
    steps = [[slot % slots for slot in range(tokens)],  # every slot, four tokens each
             [3] * 40 + [-1] * 4 + list(range(4, 14)) * 2]  # one long segment, base tokens, short ones
    plans = [plan_sgmv(step, ranks, max_segments=max_segments, max_tiles=max_tiles) for step in steps]
    static = torch.from_numpy(plans[0].packed).to(device)
    meta = metadata_views(static, plans[0])
    x = torch.randn(tokens, hidden, generator=generator).to(dtype).to(device)
    lora_a = [(torch.randn(slots, 64, hidden, generator=generator) / hidden ** 0.5).to(dtype).to(device)
              for _ in widths]
    lora_b = [(torch.randn(slots, w, 64, generator=generator) / 8).to(dtype).to(device) for w in widths]
    offsets = [0, widths[0], widths[0] + widths[1], sum(widths)]
    shrunk = torch.zeros(3, tokens, 64, dtype=dtype, device=device)
    out = torch.zeros(tokens, sum(widths), dtype=dtype, device=device)

    def step() -> None:
        shrunk.zero_()
        out.zero_()
        sgmv.sgmv_shrink(x, lora_a, meta, shrunk)
        sgmv.sgmv_expand(shrunk, lora_b, meta, out, offsets)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    static.copy_(torch.from_numpy(plans[1].packed))
    graph.replay()
    torch.cuda.synchronize()
    expected_meta = plans[1].to_metadata(device)
    expected_shrunk = torch.zeros(3, tokens, 64, device=device)
    reference.sgmv_shrink(x.float(), [a.float() for a in lora_a], expected_meta, expected_shrunk)
    expected = torch.zeros(tokens, sum(widths), device=device)
    reference.sgmv_expand(shrunk.float(), [b.float() for b in lora_b], expected_meta, expected, offsets)
    return max(relative_error(shrunk, expected_shrunk), relative_error(out, expected))


def measure(op, workload, module, config, out, expected, call, bytes_moved, device, torch) -> Result:
    """Check the variant's first output against the reference, then time it (the output keeps changing
    while it is timed, which does not matter: only the first call's result is checked)."""
    error = relative_error(out, expected)
    passed = math.isfinite(error) and error <= RELATIVE_TOLERANCE
    seconds = median_seconds(call, device, torch) if passed else None
    return Result(op, workload.name, module.name, config_label(config), error, passed, seconds, bytes_moved)


def report(results: list[Result], copy_bandwidth: float) -> str:
    from gpusuite.table import number

    lines = [f"device copy bandwidth: {copy_bandwidth / 1e9:.0f} GB/s (read + written)"]
    for op in ("shrink", "expand"):
        configs = list(dict.fromkeys(r.config for r in results if r.op == op))
        shapes = list(dict.fromkeys((r.workload, r.module) for r in results if r.op == op))
        lines += ["", f"sgmv_{op}: GB/s of the bytes that must move (FAIL = wrong result, not timed; skip = does not fit)"]
        lines += [f"  [{i}] {config}" for i, config in enumerate(configs)]
        header = f"{'shape':<52} {'MB':>7} " + " ".join(f"{f'[{i}]':>7}" for i in range(len(configs))) + "  best"
        lines.append(header)
        for shape in shapes:
            row = {r.config: r for r in results if r.op == op and (r.workload, r.module) == shape}
            cells = ["   skip" if c not in row else f"{number(row[c].gbps):>7}" if row[c].passed else "   FAIL"
                     for c in configs]  # skip: the config does not fit this shape (shared memory)
            timed = [r for r in row.values() if r.passed]
            best = max(timed, key=lambda r: r.gbps) if timed else None
            best_cell = "-" if best is None else (
                f"[{configs.index(best.config)}] {best.gbps / (copy_bandwidth / 1e9):.2f} of copy")
            mb = next(iter(row.values())).bytes_moved / 1e6
            lines.append(f"{shape[0] + ', ' + shape[1]:<52} {mb:7.2f} " + " ".join(cells) + f"  {best_cell}")
        lines.append(f"best geometric mean over shapes: {best_overall(results, op, configs)}")
    return "\n".join(lines)


def best_overall(results: list[Result], op: str, configs: list[str]) -> str:
    scores = {}
    num_shapes = len({(r.workload, r.module) for r in results if r.op == op})
    for config in configs:
        rows = [r for r in results if r.op == op and r.config == config]
        if len(rows) == num_shapes and all(r.passed for r in rows):  # timed on every shape
            scores[config] = math.exp(statistics.fmean(math.log(r.gbps) for r in rows))
    if not scores:
        return "none (every config failed somewhere)"
    best = max(scores, key=scores.get)
    return f"[{configs.index(best)}] {best} ({scores[best]:.0f} GB/s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny shapes under the Triton interpreter")
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args()
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported
    sys.path.insert(0, str(BENCHMARKS))
    import _loraloom_shim

    _loraloom_shim.use_source_tree()
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("sgmv_sweep: no CUDA device; pass --cpu for the interpreted smoke run")
    graph_ok = True
    if not args.cpu:
        error = graph_replay_check(torch)
        graph_ok = error <= RELATIVE_TOLERANCE
        print(f"CUDA graph replay with refreshed metadata: max rel err {error:.3g} "
              f"({'pass' if graph_ok else 'FAIL'})", flush=True)
    results, copy_bandwidth = run_sweep(args.cpu)
    print(report(results, copy_bandwidth))
    if args.json:
        payload = [asdict(r) | {"gbps": r.gbps} for r in results]
        args.json.write_text(json.dumps({"copy_bandwidth": copy_bandwidth, "results": payload}, indent=2))
    return 1 if not graph_ok or any(not r.passed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
