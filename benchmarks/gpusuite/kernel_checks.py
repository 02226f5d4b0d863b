"""Every kernel the engine will run on this device, checked against kernels/reference.py, then timed.

The checks run before anything is timed: a fast wrong kernel measures nothing. Inputs have the
served model's shapes (heads, head_dim, hidden, projection widths), mixed batches (decodes next
to a chunked prefill and a fresh prefill; adapters of mixed ranks next to base tokens), and the
dtypes the engine serves in. The reference runs on the CPU in fp32 on the same values. On a CPU
the backend is the reference itself, so the check can only confirm the reference's own bf16/fp16
rounding; on CUDA it tests the Triton kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusuite.ceilings import GB, TFLOP, Ceilings, seconds_per_call
from gpusuite.table import Row
from loraloom.engine.config import ModelConfig
from loraloom.kernels import reference
from loraloom.kernels.backend import KernelBackend
from loraloom.kernels.dtypes import quantize_with_scale
from loraloom.kernels.fp8 import TritonFp8Linear, fp8_linear_path, quantize_per_token, quantize_weight_per_channel
from loraloom.kernels.lora_stacks import PackedStack
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata
from loraloom.kernels.sgmv_plan import plan_sgmv, segment_capacity, tile_capacity

CHECK_DTYPES = (torch.bfloat16, torch.float16)
# Largest |kernel - reference| / max |reference| accepted: a few units of the dtype's last place.
RELATIVE_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
BLOCK_SIZE = 16
TIMED_RANK = 16  # the adapter rank
FRESH_PREFILL = 128  # tokens of the fresh prefill in the attention check
CHUNK = 96  # new tokens of the chunked prefill in the attention check


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.float().cpu()
    return float((actual.float().cpu() - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def _check_row(name: str, dtype: torch.dtype, error: float, tolerance: float) -> Row:
    dtype_name = str(dtype).removeprefix("torch.")
    return Row(f"check {name} {dtype_name}", error, "max rel err", target=f"<= {tolerance:g}",
               higher_is_better=False, passed=error <= tolerance)


# ------------------------------------------------------------------ attention
@dataclass
class AttentionCase:
    meta: AttentionMetadata  # on the device
    meta_cpu: AttentionMetadata
    num_blocks: int


def attention_case(requests: list[tuple[int, int]], device: torch.device, generator: torch.Generator) -> AttentionCase:
    """(cached context, new tokens) per request, over a shuffled pool of physical blocks."""
    seq_lens = [context + new for context, new in requests]
    blocks_needed = [-(-length // BLOCK_SIZE) for length in seq_lens]
    num_blocks = sum(blocks_needed) + 1
    physical = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros(len(requests), max(blocks_needed), dtype=torch.int32)
    slots: list[int] = []
    starts = [0]
    for b, ((context, new), count) in enumerate(zip(requests, blocks_needed)):
        own = [physical.pop() for _ in range(count)]
        tables[b, :count] = torch.tensor(own, dtype=torch.int32)
        slots += [own[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for pos in range(context, context + new)]
        starts.append(starts[-1] + new)

    def metadata(on: torch.device) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=on),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=on),
            block_tables=tables.to(on),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=on),
            query_start_loc_host=starts,
            seq_lens_host=seq_lens,
        )

    return AttentionCase(metadata(device), metadata(torch.device("cpu")), num_blocks)


def _mixed_requests(batch: int, context: int) -> list[tuple[int, int]]:
    decodes = [(max(1, context - 7 * i), 1) for i in range(batch)]
    return decodes + [(context // 2, CHUNK), (0, min(FRESH_PREFILL, context))]


def check_attention(backend: KernelBackend, config: ModelConfig, batch: int, context: int,
                    device: torch.device, dtype: torch.dtype) -> list[Row]:
    generator = torch.Generator().manual_seed(1)
    case = attention_case(_mixed_requests(batch, context), device, generator)
    tokens = case.meta.slot_mapping.numel()
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    cache_shape = (case.num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    # Every block starts with random stale K/V, so a kernel reading a wrong slot gets caught.
    k_cache, v_cache = (torch.randn(cache_shape, generator=generator).to(dtype) for _ in range(2))
    query = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
    key, value = (torch.randn(tokens, kv_heads, head_dim, generator=generator).to(dtype) for _ in range(2))
    ref_k, ref_v = k_cache.float(), v_cache.float()
    reference.write_kv_cache(key.float(), value.float(), ref_k, ref_v, case.meta_cpu.slot_mapping)
    k_dev, v_dev = k_cache.to(device, copy=True), v_cache.to(device, copy=True)  # written in place
    backend.write_kv_cache(key.to(device), value.to(device), k_dev, v_dev, case.meta.slot_mapping)
    write_error = max(_relative_error(k_dev, ref_k), _relative_error(v_dev, ref_v))
    scale = head_dim ** -0.5
    out = backend.paged_attention(query.to(device), k_dev, v_dev, case.meta, scale)
    expected = reference.paged_attention(query.float(), ref_k, ref_v, case.meta_cpu, scale)
    return [
        _check_row("write_kv_cache", dtype, write_error, 0.0),  # a copy: exact
        _check_row(f"paged_attention ({batch} decodes, chunked + fresh prefill)", dtype,
                   _relative_error(out, expected), RELATIVE_TOLERANCE[dtype]),
    ]


def check_split_decode(backend: KernelBackend, config: ModelConfig, context: int, device: torch.device,
                       dtype: torch.dtype) -> Row:
    """Two decodes alone: too few (request, KV head) programs to fill the GPU, so the kernel splits
    each sequence and combines the parts; lengths that do not fall on a split boundary."""
    generator = torch.Generator().manual_seed(5)
    case = attention_case([(context, 1), (context // 3 + 5, 1)], device, generator)
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    cache_shape = (case.num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, generator=generator).to(dtype) for _ in range(2))
    query = torch.randn(2, heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    out = backend.paged_attention(query.to(device), k_cache.to(device), v_cache.to(device), case.meta, scale)
    expected = reference.paged_attention(query.float(), k_cache.float(), v_cache.float(), case.meta_cpu, scale)
    return _check_row("paged_attention (2 decodes alone: split-KV)", dtype, _relative_error(out, expected),
                      RELATIVE_TOLERANCE[dtype])


def check_rotary_write(backend: KernelBackend, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Row:
    """q rotated in place and k rotated into the cache next to v: the reference's roundings, so exact."""
    generator = torch.Generator().manual_seed(7)
    tokens, heads, kv_heads, head_dim = 9, config.num_heads, config.num_kv_heads, config.head_dim
    case = attention_case([(5, 4), (0, 5)], device, generator)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=generator).to(dtype)
    angles = torch.rand(tokens, head_dim // 2, generator=generator) * 1000
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    cache_shape = (case.num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, generator=generator).to(dtype) for _ in range(2))

    def run(qkv, cos, sin, k_cache, v_cache, meta, op):
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = q.view(tokens, heads, head_dim)
        op(q, k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim), cos, sin, k_cache, v_cache,
           meta.slot_mapping)
        return q, k_cache

    on_device = [t.to(device, copy=True) for t in (qkv, cos, sin, k_cache, v_cache)]
    q_out, k_out = run(*on_device, case.meta, backend.rotary_write_kv_cache)
    q_ref, k_ref = run(qkv, cos, sin, k_cache, v_cache, case.meta_cpu, reference.rotary_write_kv_cache)
    error = max(_relative_error(q_out, q_ref), _relative_error(k_out, k_ref), _relative_error(on_device[4], v_cache))
    return _check_row("rotary_write_kv_cache", dtype, error, 0.0)


# ------------------------------------------------------------------ FP8 KV cache
FP8_K_SCALE, FP8_V_SCALE = 0.05, 0.004  # |K| ~ 4 / 0.05 = 80 fits; |V| ~ 3 / 0.004 > 448 saturates some codes


def _fp8_code_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Share of e4m3 codes that differ: the writes round like torch, so 0."""
    return float((actual.cpu().view(torch.uint8) != expected.view(torch.uint8)).float().mean())


def check_fp8_kv_cache(backend: KernelBackend, config: ModelConfig, batch: int, context: int,
                       device: torch.device, dtype: torch.dtype) -> list[Row]:
    """The FP8 (e4m3) cache: the K/V write and the rotary write code for code against the reference,
    and attention (decodes next to chunked and fresh prefills; then two decodes alone, split-KV) over
    the same FP8 cache against the reference dequantizing it in fp32."""
    generator = torch.Generator().manual_seed(8)
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    scales_cpu = torch.tensor([FP8_K_SCALE]), torch.tensor([FP8_V_SCALE])
    scales = tuple(scale.to(device) for scale in scales_cpu)
    rows, write_errors = [], []
    for label, requests in ((f"{batch} decodes, chunked + fresh prefill", _mixed_requests(batch, context)),
                            ("2 decodes alone: split-KV", [(context, 1), (context // 3 + 5, 1)])):
        case = attention_case(requests, device, generator)
        tokens = case.meta.slot_mapping.numel()
        cache_shape = (case.num_blocks, BLOCK_SIZE, kv_heads, head_dim)
        # Stale codes everywhere, so a read of a wrong slot is caught.
        k_cache, v_cache = (quantize_with_scale(torch.randn(cache_shape, generator=generator), scale)
                            for scale in scales_cpu)
        query = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
        key, value = (torch.randn(tokens, kv_heads, head_dim, generator=generator).mul(3).to(dtype) for _ in range(2))
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        reference.write_kv_cache(key, value, ref_k, ref_v, case.meta_cpu.slot_mapping, *scales_cpu)
        k_dev, v_dev = k_cache.to(device, copy=True), v_cache.to(device, copy=True)
        backend.write_kv_cache(key.to(device), value.to(device), k_dev, v_dev, case.meta.slot_mapping, *scales)
        write_errors += [_fp8_code_mismatch(k_dev, ref_k), _fp8_code_mismatch(v_dev, ref_v)]
        scale = head_dim ** -0.5
        out = backend.paged_attention(query.to(device), k_dev, v_dev, case.meta, scale, *scales)
        expected = reference.paged_attention(query.float(), ref_k, ref_v, case.meta_cpu, scale, *scales_cpu)
        rows.append(_check_row(f"paged_attention, fp8 cache ({label})", dtype, _relative_error(out, expected),
                               RELATIVE_TOLERANCE[dtype]))
    rows.append(_check_row("write_kv_cache, fp8 cache (share of codes differing)", dtype, max(write_errors), 0.0))
    # The rotary write into an FP8 cache: q rotated in place, rotated k and v quantized.
    q_dev, k_rot, v_rot = (t.to(device, copy=True) for t in (query, k_cache, v_cache))
    angles = torch.rand(tokens, head_dim // 2, generator=generator) * 1000
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dtype) for f in (torch.cos, torch.sin))
    backend.rotary_write_kv_cache(q_dev, key.to(device), value.to(device), cos.to(device), sin.to(device),
                                  k_rot, v_rot, case.meta.slot_mapping, *scales)
    q_ref, k_ref, v_ref = query.clone(), k_cache.clone(), v_cache.clone()
    reference.rotary_write_kv_cache(q_ref, key, value, cos, sin, k_ref, v_ref, case.meta_cpu.slot_mapping, *scales_cpu)
    rotary_error = max(_fp8_code_mismatch(k_rot, k_ref), _fp8_code_mismatch(v_rot, v_ref),
                       _relative_error(q_dev, q_ref))
    rows.append(_check_row("rotary_write_kv_cache, fp8 cache", dtype, rotary_error, 0.0))
    return rows


# ----------------------------------------------------------------------- norms
NORM_TOKENS = 37  # a few rows, not a power of two


def check_norms(backend: KernelBackend, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> list[Row]:
    """rms_norm and fused_add_rms_norm at the model's hidden size, rows of very different scales."""
    generator = torch.Generator().manual_seed(6)
    hidden = config.hidden_size
    scales = torch.logspace(-2, 2, NORM_TOKENS)[:, None]
    x, residual = ((torch.randn(NORM_TOKENS, hidden, generator=generator) * scales).to(dtype) for _ in range(2))
    weight = (1 + 0.5 * torch.randn(hidden, generator=generator)).to(dtype)
    eps = config.rms_norm_eps
    out = backend.rms_norm(x.to(device), weight.to(device), eps)
    normed, new_residual = backend.fused_add_rms_norm(x.to(device), residual.to(device), weight.to(device), eps)
    # The reference on the CPU in the same dtype: the same roundings (the add, the normed value,
    # the product), so only the fp32 reduction order and rsqrt may differ.
    expected_normed, expected_residual = reference.fused_add_rms_norm(x, residual, weight, eps)
    tolerance = RELATIVE_TOLERANCE[dtype]
    return [
        _check_row("rms_norm", dtype, _relative_error(out, reference.rms_norm(x, weight, eps)), tolerance),
        _check_row("fused_add_rms_norm (normed)", dtype, _relative_error(normed, expected_normed), tolerance),
        _check_row("fused_add_rms_norm (residual)", dtype, _relative_error(new_residual, expected_residual), 0.0),
    ]


# ----------------------------------------------------------------------- SGMV
@dataclass
class SGMVCase:
    x: torch.Tensor  # [T, hidden]
    lora_a: list[torch.Tensor]  # q, k, v: [S, R, hidden]
    lora_b: list[torch.Tensor]  # q, k, v: [S, out_i, R]
    ranks: list[list[int]]  # [slice][slot]: each slot's rank in q, k and v (0: the adapter does not target it)
    meta: SGMVMetadata
    offsets: list[int]  # column offsets of q, k, v in the fused output


def sgmv_case(config: ModelConfig, token_slots: list[int], slot_ranks: list[int], device: torch.device,
              dtype: torch.dtype, generator: torch.Generator, untargeted_every: int = 0) -> SGMVCase:
    """The qkv projection's LoRA: three slices, one adapter stack per slot at the largest rank.
    With untargeted_every=n, every n-th slot targets q only (rank 0 in k and v), as a q-only adapter does."""
    hidden = config.hidden_size
    widths = [config.num_heads * config.head_dim] + [config.num_kv_heads * config.head_dim] * 2
    slots, max_rank = len(slot_ranks), max(slot_ranks)
    x = torch.randn(len(token_slots), hidden, generator=generator)
    lora_a = [torch.randn(slots, max_rank, hidden, generator=generator) / hidden ** 0.5 for _ in widths]
    lora_b = [torch.randn(slots, width, max_rank, generator=generator) / max_rank ** 0.5 for width in widths]
    host = [list(slot_ranks) for _ in widths]
    if untargeted_every:
        for slot in range(0, slots, untargeted_every):
            host[1][slot] = host[2][slot] = 0
    offsets = [0]
    for width in widths:
        offsets.append(offsets[-1] + width)
    return SGMVCase(
        x=x.to(dtype).to(device),
        lora_a=[a.to(dtype).to(device) for a in lora_a],
        lora_b=[b.to(dtype).to(device) for b in lora_b],
        ranks=host,
        meta=_padded_metadata(token_slots, slot_ranks, device),
        offsets=offsets,
    )


def loaded_stack(case: SGMVCase, stack_type, device: torch.device, dtype: torch.dtype):
    """The case's adapters loaded into a stack of `stack_type` (the layout an add_lora reads), as the slot pool loads them."""
    max_rank = case.lora_a[0].shape[1]
    stack = stack_type.allocate(len(case.ranks[0]), max_rank, case.x.shape[1], [b.shape[1] for b in case.lora_b],
                                dtype, device)
    for slot in range(len(case.ranks[0])):
        stack.load(slot, [(a[slot, :ranks[slot]].to(device, dtype), b[slot, :, :ranks[slot]].to(device, dtype))
                          if ranks[slot] else None for a, b, ranks in zip(case.lora_a, case.lora_b, case.ranks)])
    return stack


def _padded_metadata(token_slots: list[int], slot_ranks: list[int], device: torch.device) -> SGMVMetadata:
    """Metadata padded to the capacities of its batch size, as a CUDA-graph step has it."""
    max_segments = segment_capacity(len(token_slots), len(slot_ranks))
    return plan_sgmv(token_slots, slot_ranks, max_segments=max_segments,
                     max_tiles=tile_capacity(len(token_slots), max_segments)).to_metadata(device)


def _mixed_token_slots(batch: int, prefill: int, generator: torch.Generator) -> list[int]:
    """One decode token per adapter slot, a few base tokens, and a prefill on slot 0, in scrambled order."""
    slots = list(range(batch)) + [-1] * 8 + [0] * prefill
    order = torch.randperm(len(slots), generator=generator).tolist()
    return [slots[i] for i in order]


def check_sgmv(backend: KernelBackend, config: ModelConfig, batch: int, ranks: tuple[int, ...],
               device: torch.device, dtype: torch.dtype) -> list[Row]:
    """add_lora on mixed ranks, q-only adapters among qkv ones, base tokens and a prefill, against
    the fp32 reference from the same (rounded) inputs."""
    generator = torch.Generator().manual_seed(2)
    slot_ranks = [ranks[i % len(ranks)] for i in range(batch)]
    token_slots = _mixed_token_slots(batch, FRESH_PREFILL, generator)
    case = sgmv_case(config, token_slots, slot_ranks, device, dtype, generator, untargeted_every=3)
    meta_cpu = _padded_metadata(token_slots, slot_ranks, torch.device("cpu"))
    base = torch.randn(case.x.shape[0], case.offsets[-1], generator=generator).to(dtype)
    out = base.to(device, copy=True)  # updated in place
    backend.add_lora(case.x, loaded_stack(case, backend.lora_stack, device, dtype), case.meta, out, case.offsets)
    expected = base.float()
    reference_stack = loaded_stack(case, PackedStack, torch.device("cpu"), torch.float32)
    reference.add_lora(case.x.float().cpu(), reference_stack, meta_cpu, expected, case.offsets)
    label = f"({batch} adapters, ranks {min(ranks)}-{max(ranks)}, some q-only, + prefill + base, padded metadata)"
    return [_check_row(f"add_lora {label}", dtype, _relative_error(out, expected), RELATIVE_TOLERANCE[dtype])]


# ------------------------------------------------------------------------ FP8
def check_fp8_linear(backend: KernelBackend, config: ModelConfig, tokens: int, device: torch.device,
                     dtype: torch.dtype) -> list[Row]:
    """The gate/up projection in FP8 against the dequantizing reference on the same quantized values,
    at one token and at `tokens`: on an FP8 GPU the small-M Triton kernel and the quantization kernel
    + _scaled_mm path respectively (fp8_linear_path names which one ran)."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(2 * config.intermediate_size, config.hidden_size, generator=generator).to(dtype).to(device)
    w_q, w_scale = quantize_weight_per_channel(weight)
    rows = []
    for count in sorted({1, tokens}):
        x = torch.randn(count, config.hidden_size, generator=generator).to(dtype).to(device)
        x_q, x_scale = quantize_per_token(x)
        out = backend.fp8_linear(x, w_q, w_scale, None, False)
        expected = reference.fp8_scaled_mm(x_q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), torch.float32)
        path = fp8_linear_path(device, count, w_q.shape, isinstance(backend.fp8_linear, TritonFp8Linear))
        rows.append(_check_row(f"fp8_linear ({count} tokens, gate_up, {path})", dtype,
                               _relative_error(out, expected), RELATIVE_TOLERANCE[dtype]))
    return rows


def check_all(backend: KernelBackend, config: ModelConfig, batch: int, context: int, ranks: tuple[int, ...],
              device: torch.device, quantized: bool) -> list[Row]:
    rows: list[Row] = []
    for dtype in CHECK_DTYPES:
        rows += check_attention(backend, config, batch, context, device, dtype)
        rows.append(check_split_decode(backend, config, context, device, dtype))
        rows += check_norms(backend, config, device, dtype)
        rows.append(check_rotary_write(backend, config, device, dtype))
        rows += check_fp8_kv_cache(backend, config, batch, context, device, dtype)
        rows += check_sgmv(backend, config, batch, ranks, device, dtype)
    if quantized:
        rows += check_fp8_linear(backend, config, batch, device, torch.bfloat16)
    return rows


# --------------------------------------------------------------------- timing
def timing_rows(backend: KernelBackend, config: ModelConfig, batch: int, context: int, prefill: int,
                device: torch.device, dtype: torch.dtype, ceilings: Ceilings, quantized: bool) -> list[Row]:
    """Each kernel at the served shapes, against the bandwidth (decode) or matrix-rate (prefill) ceiling."""
    calls = 20 if device.type == "cuda" else 2
    generator = torch.Generator().manual_seed(4)
    rows = _attention_timings(backend, config, batch, context, prefill, device, dtype, ceilings, calls, generator)
    rows += _norm_timings(backend, config, batch, prefill, device, dtype, ceilings, calls, generator)
    rows += _sgmv_timings(backend, config, batch, device, dtype, ceilings, calls, generator)
    if quantized:
        rows += _fp8_timings(backend, config, prefill, device, dtype, ceilings, calls, generator)
    return rows


def _attention_timings(backend, config, batch, context, prefill, device, dtype, ceilings, calls,
                       generator) -> list[Row]:
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    rows = []
    # Batch 1 is the launch-bound, split-KV case; `batch` requests fill the GPU without splitting.
    cases = [("decode", [(context, 1)] * size) for size in sorted({1, batch})] + [("prefill", [(0, prefill)])]
    for label, requests in cases:
        case = attention_case(requests, device, generator)
        tokens = case.meta.slot_mapping.numel()
        cache_shape = (case.num_blocks, BLOCK_SIZE, kv_heads, head_dim)
        k_cache, v_cache = (torch.randn(cache_shape, device=device).to(dtype) for _ in range(2))
        query = torch.randn(tokens, heads, head_dim, device=device).to(dtype)
        seconds = seconds_per_call(
            lambda: backend.paged_attention(query, k_cache, v_cache, case.meta, head_dim ** -0.5), device, calls)
        if label == "decode":
            size = len(requests)
            kv_bytes = 2 * size * (context + 1) * kv_heads * head_dim * dtype.itemsize  # K and V, one layer
            rows.append(Row(f"kernel paged_attention decode ({size} x {context} context)",
                            kv_bytes / seconds / GB, "GB/s", ceiling=ceilings.copy_bandwidth / GB))
        else:
            flops = 4 * heads * head_dim * prefill * (prefill + 1) // 2
            rows.append(Row(f"kernel paged_attention prefill ({prefill} tokens)", flops / seconds / TFLOP,
                            "TFLOP/s", ceiling=ceilings.matmul_rate / TFLOP))
    return rows


def _norm_timings(backend, config, batch, prefill, device, dtype, ceilings, calls, generator) -> list[Row]:
    """fused_add_rms_norm (the one in every layer): microseconds at decode sizes, where a launch
    is the whole cost, and bandwidth at a prefill's rows (reads x, residual; writes both outputs)."""
    hidden, eps = config.hidden_size, config.rms_norm_eps
    weight = torch.ones(hidden, device=device, dtype=dtype)
    rows = []
    for tokens in sorted({1, batch, prefill}):
        x, residual = (torch.randn(tokens, hidden, device=device).to(dtype) for _ in range(2))
        seconds = seconds_per_call(lambda: backend.fused_add_rms_norm(x, residual, weight, eps), device, calls)
        label = f"kernel fused_add_rms_norm ({tokens} x {hidden})"
        if tokens == prefill:
            moved = (4 * tokens + 1) * hidden * dtype.itemsize
            rows.append(Row(label, moved / seconds / GB, "GB/s", ceiling=ceilings.copy_bandwidth / GB))
        else:
            rows.append(Row(label, seconds * 1e6, "us", higher_is_better=False))
    return rows


def _sgmv_timings(backend, config, batch, device, dtype, ceilings, calls, generator) -> list[Row]:
    case = sgmv_case(config, list(range(batch)), [TIMED_RANK] * batch, device, dtype, generator)
    tokens, hidden, out_width = batch, config.hidden_size, case.offsets[-1]
    out = torch.zeros(tokens, out_width, dtype=dtype, device=device)
    stack = loaded_stack(case, backend.lora_stack, device, dtype)
    seconds = seconds_per_call(lambda: backend.add_lora(case.x, stack, case.meta, out, case.offsets), device, calls)
    # What must move: every active adapter's A and B once, the activations in, the output read and written.
    weights = batch * TIMED_RANK * (len(case.lora_a) * hidden + out_width)
    moved = (weights + tokens * hidden + 2 * out.numel()) * dtype.itemsize
    label = f"decode ({batch} tokens, {batch} adapters r{TIMED_RANK}, qkv)"
    return [Row(f"kernel add_lora {label}", moved / seconds / GB, "GB/s", ceiling=ceilings.copy_bandwidth / GB)]


def _fp8_timings(backend, config, prefill, device, dtype, ceilings, calls, generator) -> list[Row]:
    out_features, in_features = 2 * config.intermediate_size, config.hidden_size
    weight = torch.randn(out_features, in_features, device=device).to(dtype)
    w_q, w_scale = quantize_weight_per_channel(weight)
    rows = []
    for tokens in (1, prefill):
        x = torch.randn(tokens, in_features, device=device).to(dtype)
        seconds = seconds_per_call(lambda: backend.fp8_linear(x, w_q, w_scale, None, False), device, calls)
        label = f"kernel fp8_linear gate_up {out_features}x{in_features}, {tokens} token(s)"
        if tokens == 1:
            rows.append(Row(label, w_q.numel() / seconds / GB, "GB/s", ceiling=ceilings.copy_bandwidth / GB))
        else:
            rate = ceilings.fp8_matmul_rate or ceilings.matmul_rate
            rows.append(Row(label, 2 * tokens * w_q.numel() / seconds / TFLOP, "TFLOP/s", ceiling=rate / TFLOP))
    return rows
