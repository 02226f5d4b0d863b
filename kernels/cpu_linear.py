"""The CPU backend's linear layers: up to MAX_CHUNKED_ROWS rows (decode steps, short prefills), the
compiled panel matmul cut into column chunks (kernels/csrc/overlapped_linear.cpp, panel_matmul.h) over a
copy of the weight packed into 32-column panels once; past that (prefills), oneDNN's matmul
(kernels/onednn_linear.py); torch's matmul where neither applies. A LoRA-wrapped linear streams the adapter
weights from memory on one thread beside the chunked matmul, or adds them after the other matmuls.

Why our own matmul: torch's matmul calls MKL, which runs its AVX2 kernels on AMD CPUs that have AVX-512,
and oneDNN's matmul has a fixed cost per call too large to cut into chunks; the panel matmul uses the
CPU's widest vectors at any row count (`benchmarks/cpu_linear.py` compares them on this machine).

Why chunks: for a few rows, a matmul on two threads spends much of its time keeping them in step. Cut
into column chunks, each a single-threaded matmul that the threads take from a shared counter, MKL's
matmul ran faster on a 2-core EPYC with weights coming from memory (`benchmarks/cpu_linear.py`): 35 -> 21
ms at 1 row, 41 -> 33 ms at 8, 68 -> 60 ms at 32.

Why overlapped: a decode step's LoRA reads each adapter's weights once for a row or two, so it is
bound by memory, and one core alone draws most of the bandwidth; the base matmul is bound by
arithmetic. Run one after the other, the second core gains the LoRA little; side by side, 8 adapters'
LoRA cost 5.2 ms a decode step instead of 9.1 (csrc/overlapped_linear.cpp).

linear_add_lora returns the same bits as linear followed by kernels/packed_lora.py add_lora (each
element's LoRA sum is added to its base dot product once). The panel matmul and oneDNN sum in other
orders than MKL (a float32 rounding apart, ~1e-4 on products of ~25); the engine's greedy parity with
HF+PEFT holds (tests/engine/test_parity.py).

The packed copy is kept on the weight (kernels/weight_copies.py), beside the weight itself: with oneDNN's
copy for prefills, a CPU model's linears take up to three times their float32 size in memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from loraloom.kernels import cpu_extension, onednn_linear, packed_lora, weight_copies
from loraloom.kernels.lora_stacks import PANEL_WIDTH, PackedStack
from loraloom.kernels.metadata import SGMVMetadata

# Inputs of up to this many rows go through the chunked matmul (decode steps, short prefills). Past it the
# panel matmul rereads each panel once per 8 rows, and oneDNN's blocking serves long inputs better.
MAX_CHUNKED_ROWS = 128
# kernels/csrc/panel_matmul.h kPanelColumns: output columns per packed panel.
PACKED_PANEL_COLUMNS = 32
# Each thread should get several chunks, so that the one that started on the LoRA finds matmul work
# left when it is done; chunks of 64 to 512 columns (a multiple of 64 keeps them cache-line aligned).
CHUNKS_PER_THREAD = 4
MIN_CHUNK_COLUMNS, MAX_CHUNK_COLUMNS = 64, 512


def chunk_columns(out_features: int) -> int:
    """Columns per chunk: CHUNKS_PER_THREAD or more chunks a thread, in multiples of 64 columns."""
    per_chunk = out_features // (CHUNKS_PER_THREAD * max(1, torch.get_num_threads()))
    return min(MAX_CHUNK_COLUMNS, max(MIN_CHUNK_COLUMNS, per_chunk // 64 * 64))


def packed_weight(weight: torch.Tensor) -> torch.Tensor:  # [out, in] -> [ceil(out / 32), in, 32]
    """The weight in panels of 32 output columns, each panel's rows of 32 weights one after another and
    zeros past the last column: kept on the weight (kernels/weight_copies.py)."""
    def pack(w: torch.Tensor) -> torch.Tensor:
        out_features, in_features = w.shape
        panels = -(-out_features // PACKED_PANEL_COLUMNS)
        padded = w.new_zeros(panels * PACKED_PANEL_COLUMNS, in_features)
        padded[:out_features] = w
        return padded.view(panels, PACKED_PANEL_COLUMNS, in_features).transpose(1, 2).contiguous()
    return weight_copies.kept_copy(weight, "panels", pack)


def _chunked_module(x: torch.Tensor, weight: torch.Tensor):
    """The compiled module when it handles these operands, else None."""
    if (x.dim() != 2 or x.shape[0] > MAX_CHUNKED_ROWS or x.dtype != torch.float32 or weight.dtype != torch.float32
            or x.device.type != "cpu" or weight.device.type != "cpu" or not weight_copies.can_keep_copies(weight)):
        return None
    return cpu_extension.load()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [T, in] x [out, in] -> [T, out]
    compiled = _chunked_module(x, weight)
    if compiled is not None:
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        compiled.chunked_linear(x.contiguous(), packed_weight(weight), out, chunk_columns(weight.shape[0]))
        return out
    if onednn_linear.applies(x, weight):
        return onednn_linear.matmul(x, weight)
    return F.linear(x, weight)


def linear_add_lora(x: torch.Tensor, weight: torch.Tensor, stack: PackedStack, meta: SGMVMetadata,
                    slice_offsets: list[int]) -> torch.Tensor:
    """x @ weight.T plus every adapter token's LoRA (kernels/reference.py add_lora's contract)."""
    compiled = _chunked_module(x, weight)
    if compiled is None or stack.weights.device.type != "cpu":
        out = linear(x, weight)
        packed_lora.add_lora(x, stack, meta, out, slice_offsets)
        return out
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    compiled.linear_add_lora(x.contiguous(), packed_weight(weight), out, chunk_columns(weight.shape[0]),
                             stack.weights, PANEL_WIDTH, stack.ranks, stack.slot_types, slice_offsets,
                             meta.segment_table_host, meta.sorted_token_ids)
    return out
