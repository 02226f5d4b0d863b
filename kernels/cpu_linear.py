"""The CPU backend's linear layers: the compiled chunked matmul (kernels/csrc/overlapped_linear.cpp)
for decode-shaped inputs, and a LoRA-wrapped linear whose adapter weights stream from memory on one
thread while the other threads run the base matmul.

Why chunks: for a few rows, torch's matmul on two threads spends much of its time keeping them in
step. Cut into column chunks, each a single-threaded matmul that the threads take from a shared
counter, the same product ran faster on a 2-core EPYC with weights coming from memory (a layer stack
of the bundled model, `benchmarks/cpu_linear.py`): 35 -> 21 ms at 1 row, 41 -> 33 ms at 8, 68 -> 60 ms
at 32, even at 128, and 7% slower at 512, so prefill-sized inputs keep torch's matmul.

Why overlapped: a decode step's LoRA reads each adapter's weights once for a row or two, so it is
bound by memory, and one core alone draws most of the bandwidth; the base matmul is bound by
arithmetic. Run one after the other, the second core gains the LoRA little; side by side, 8 adapters'
LoRA cost 5.2 ms a decode step instead of 9.1 (csrc/overlapped_linear.cpp).

linear_add_lora returns the same bits as linear followed by kernels/packed_lora.py add_lora (each
element's LoRA sum is added to its base dot product once). The chunks are the same matmul kernel
on fewer columns: on the machines measured they matched F.linear bit for bit, and the engine's
greedy parity with HF+PEFT holds (tests/engine/test_parity.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from loraloom.kernels import cpu_extension, packed_lora
from loraloom.kernels.lora_stacks import PANEL_WIDTH, PackedStack
from loraloom.kernels.metadata import SGMVMetadata

# Inputs of up to this many rows go through the chunked matmul (decode steps, short prefills).
MAX_CHUNKED_ROWS = 128
# Each thread should get several chunks, so that the one that started on the LoRA finds matmul work
# left when it is done; chunks of 64 to 512 columns (a multiple of 64 keeps them cache-line aligned).
CHUNKS_PER_THREAD = 4
MIN_CHUNK_COLUMNS, MAX_CHUNK_COLUMNS = 64, 512


def chunk_columns(out_features: int) -> int:
    """Columns per chunk: CHUNKS_PER_THREAD or more chunks a thread, in multiples of 64 columns."""
    per_chunk = out_features // (CHUNKS_PER_THREAD * max(1, torch.get_num_threads()))
    return min(MAX_CHUNK_COLUMNS, max(MIN_CHUNK_COLUMNS, per_chunk // 64 * 64))


def _chunked_module(x: torch.Tensor, weight: torch.Tensor):
    """The compiled module when it handles these operands, else None."""
    if (x.dim() != 2 or x.shape[0] > MAX_CHUNKED_ROWS or x.dtype != torch.float32 or weight.dtype != torch.float32
            or x.device.type != "cpu" or weight.device.type != "cpu" or weight.stride(-1) != 1):
        return None
    return cpu_extension.load()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [T, in] x [out, in] -> [T, out]
    compiled = _chunked_module(x, weight)
    if compiled is None:
        return F.linear(x, weight)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    compiled.chunked_linear(x.contiguous(), weight, out, chunk_columns(weight.shape[0]))
    return out


def linear_add_lora(x: torch.Tensor, weight: torch.Tensor, stack: PackedStack, meta: SGMVMetadata,
                    slice_offsets: list[int]) -> torch.Tensor:
    """x @ weight.T plus every adapter token's LoRA (kernels/reference.py add_lora's contract)."""
    compiled = _chunked_module(x, weight)
    if compiled is None or stack.weights.device.type != "cpu":
        out = F.linear(x, weight)
        packed_lora.add_lora(x, stack, meta, out, slice_offsets)
        return out
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    compiled.linear_add_lora(x.contiguous(), weight, out, chunk_columns(weight.shape[0]), stack.weights, PANEL_WIDTH,
                             stack.ranks, stack.slot_types, slice_offsets, meta.segment_table_host,
                             meta.sorted_token_ids)
    return out
