"""Decode steps replayed from CUDA graphs.

A decode step of an 8B model is a few thousand small kernel launches; launched one by one from
Python they take several times longer than the GPU needs to run them. A CUDA graph records the
launches of one forward pass once and replays them with a single call. What a graph records is
fixed: tensor addresses, shapes and launch grids. So:

- every input of the forward pass lives in a static buffer, sized for the largest captured
  batch; a step copies its values in (a few host-to-device copies) and replays;
- a graph is captured per batch size of CAPTURE_SIZES (up to max_num_seqs); a step of n requests
  replays the smallest captured size b >= n, and rows n..b are padding: no new tokens in
  query_start_loc (attention skips them), KV slot -1 (the cache write skips them), adapter slot
  -1 (LoRA skips them), and their outputs are never read;
- the kernels size their grids from shapes only, never from the step's values
  (kernels/paged_attention.py, kernels/sgmv.py), so a replay with new metadata is correct;
- steps with adapters and base-only steps get separate graphs: a base-only step launches no
  LoRA kernel at all.

Steps that are not plain decodes (a prefill chunk, a batch larger than the largest graph) run
eagerly. The logits (one lm_head GEMM over the real rows) are computed outside the graph, so
the graphs only keep [b, hidden] outputs alive.

On a CPU the same class runs with `capture=False`: "replay" calls the forward pass on the same
static buffers and padding, which is how the tests check the padding logic without a GPU.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from loraloom.engine.step_batch import HostBatch
from loraloom.engine.step_memo import AdapterMixMemo
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata
from loraloom.kernels.sgmv_plan import SGMVPlan, metadata_views, plan_sgmv, segment_capacity, tile_capacity

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)

# model(input_ids, positions, attn, lora) -> hidden [T, hidden]; the KV caches are bound in.
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, SGMVMetadata | None], torch.Tensor]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """CAPTURE_SIZES up to max_num_seqs, plus max_num_seqs itself so that every decode batch fits."""
    sizes = [size for size in CAPTURE_SIZES if size < max_num_seqs]
    return sizes + [max_num_seqs]


@dataclass
class _Graph:
    size: int
    attn: AttentionMetadata
    lora: SGMVMetadata | None
    hidden: torch.Tensor | None = None  # [size, hidden], the graph's output
    graph: "torch.cuda.CUDAGraph | None" = None


@dataclass
class StagedStep:
    """A decode step whose inputs sit in a graph's static buffers, ready to replay."""

    entry: _Graph
    count: int  # real rows; the rest of entry.size is padding


class DecodeGraphs:
    def __init__(
        self,
        forward: Forward,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        capture: bool,
        lora_metadata: GraphLoRAMetadata | None = None,
    ):
        self.forward = forward
        self.sizes = capture_sizes(max_num_seqs)
        self.device = device
        self.capture = capture
        self.lora_metadata = lora_metadata
        largest = self.sizes[-1]
        self._largest = largest
        # One buffer per dtype, so that a step refreshes each with a single copy.
        self._tokens = torch.zeros(3, largest, dtype=torch.int64, device=device)  # ids, positions, KV slots
        self._seqs = torch.zeros(2 * largest + 1, dtype=torch.int32, device=device)  # qsl [b+1], then seq_lens [b]
        self._block_tables = torch.zeros(largest, max_blocks_per_seq, dtype=torch.int32, device=device)
        self._tokens_host = np.zeros((3, largest), np.int64)
        self._seqs_host = np.zeros(2 * largest + 1, np.int32)
        self._graphs: dict[tuple[int, bool], _Graph] = {}
        self._pool = None

    # ------------------------------------------------------------------ capture
    def capture_all(self) -> None:
        """Record a graph per (size, with adapters); largest first so smaller ones reuse its memory."""
        variants = [False] + ([True] if self.lora_metadata is not None else [])
        if self.capture:
            self._pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for with_lora in variants:
                self._graphs[size, with_lora] = self._record(size, with_lora)

    def _record(self, size: int, with_lora: bool) -> _Graph:
        self._write_empty_batch(size)
        lora = self.lora_metadata.for_capture(size) if with_lora else None
        entry = _Graph(size=size, attn=self._attention_metadata(size, decode_host_lists(size)), lora=lora)
        if not self.capture:
            return entry
        # Once eagerly first: Triton compiles its kernels and cuBLAS picks its algorithms
        # outside the capture, where nothing may be allocated or synchronized.
        self._run(entry)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            entry.hidden = self._run(entry)
        entry.graph = graph
        return entry

    # ------------------------------------------------------------------- replay
    def can_run(self, batch: HostBatch) -> bool:
        if not batch.is_decode or batch.num_seqs > self._largest:
            return False
        return not batch.uses_adapters or self.lora_metadata is not None

    def stage(self, batch: HostBatch) -> StagedStep:
        """Copy the batch into the static buffers of the smallest graph that holds it (host work)."""
        count = batch.num_seqs
        size = next(size for size in self.sizes if size >= count)
        entry = self._graphs[size, batch.uses_adapters]
        self._write_batch(batch, size)
        lora = None
        if entry.lora is not None:
            padded_slots = np.full(size, -1, np.int32)
            padded_slots[:count] = batch.token_slots
            lora = self.lora_metadata.write(padded_slots, size)
        if entry.graph is None:
            # No capture (CPU): the same static buffers and padding, run eagerly; the references read
            # the host lists, so they get the step's real (padded) values.
            qsl = self._seqs_host[:size + 1].tolist()
            seq_lens = self._seqs_host[self._largest + 1:self._largest + 1 + size].tolist()
            entry = _Graph(size=size, attn=self._attention_metadata(size, (qsl, seq_lens)), lora=lora)
        return StagedStep(entry, count)

    def replay(self, staged: StagedStep) -> torch.Tensor:
        """hidden [n, hidden] of the staged batch's n decode tokens."""
        entry = staged.entry
        if entry.graph is None:
            return self._run(entry)[:staged.count]
        entry.graph.replay()
        return entry.hidden[:staged.count]

    # ------------------------------------------------------------------ helpers
    def _run(self, entry: _Graph) -> torch.Tensor:
        size = entry.size
        return self.forward(self._tokens[0, :size], self._tokens[1, :size], entry.attn, entry.lora)

    def _attention_metadata(self, size: int, host_lists: tuple[list[int], list[int]]) -> AttentionMetadata:
        largest = self._largest
        return AttentionMetadata(
            query_start_loc=self._seqs[:size + 1],
            seq_lens=self._seqs[largest + 1:largest + 1 + size],
            block_tables=self._block_tables[:size],
            slot_mapping=self._tokens[2, :size],
            query_start_loc_host=host_lists[0],
            seq_lens_host=host_lists[1],
        )

    def _write_batch(self, batch: HostBatch, size: int) -> None:
        count, largest = batch.num_seqs, self._largest
        tokens = self._tokens_host
        tokens[0, :count] = batch.input_ids
        tokens[1, :count] = batch.positions
        tokens[2, :count] = batch.slot_mapping
        seqs = self._seqs_host
        seqs[:count + 1] = batch.query_start_loc
        seqs[largest + 1:largest + 1 + count] = batch.seq_lens
        self._pad_host(count, size)
        self._upload()
        width = batch.block_tables.shape[1]
        # Only the step's columns: the rest of a row is never read (attention stops at seq_len).
        self._block_tables[:count, :width].copy_(torch.from_numpy(batch.block_tables))

    def _write_empty_batch(self, size: int) -> None:
        """A batch of `size` padding rows: what capture runs (and records) before any real step."""
        self._seqs_host[0] = 0
        self._pad_host(0, size)
        self._upload()

    def _upload(self) -> None:
        """One host-to-device copy per static buffer."""
        self._tokens.copy_(torch.from_numpy(self._tokens_host))
        self._seqs.copy_(torch.from_numpy(self._seqs_host))

    def _pad_host(self, count: int, size: int) -> None:
        largest = self._largest
        self._tokens_host[:, count:size] = 0
        self._tokens_host[2, count:size] = -1  # KV slot -1: the cache write skips the row
        self._seqs_host[count + 1:size + 1] = count  # no new tokens: attention skips the request
        self._seqs_host[largest + 1 + count:largest + 1 + size] = 0


def decode_host_lists(size: int) -> tuple[list[int], list[int]]:
    """Host lists of a batch of `size` one-token requests: what the kernel launchers see at capture.

    The Triton launchers read them only to choose which kernels to launch (decode vs prefill)
    and how many sequences the grid covers; the replayed values come from the device buffers.
    """
    return list(range(size + 1)), [1] * size


class GraphLoRAMetadata:
    """SGMV metadata in one static int32 buffer per captured size (layout: kernels/sgmv_plan.py).

    Capacities are the most segments and row tiles a batch of that size can need, so any step
    that fits the batch fits the buffer, and the kernels' grids (sized from the capacities) stay
    what was captured.
    """

    def __init__(self, slot_ranks: Callable[[], list[int]], num_slots: int, device: torch.device):
        self._slot_ranks = slot_ranks  # read at each step: adapters load into slots between steps
        self._num_slots = num_slots
        self._device = device
        self._buffers: dict[int, torch.Tensor] = {}
        self._memo: AdapterMixMemo[SGMVMetadata] = AdapterMixMemo()  # per size: the buffer already holds it

    def for_capture(self, size: int) -> SGMVMetadata:
        plan = self._plan(np.full(size, -1, np.int32), size)
        buffer = torch.from_numpy(plan.packed).to(self._device)  # all padding: the warm-up run does nothing
        self._buffers[size] = buffer
        self._memo.forget(size)  # a new buffer holds none of the earlier steps' metadata
        # Counted as full so that LoRALinear records the kernels instead of skipping a base-only step.
        return dataclasses.replace(metadata_views(buffer, plan), num_segments=plan.layout.max_segments)

    def write(self, token_slots: np.ndarray, size: int) -> SGMVMetadata:
        """Refresh size's buffer for a step; returns metadata with the step's host lists (the CPU path).

        A step with the same adapter mix as the last one of its size finds the buffer already right.
        """
        return self._memo.get(size, token_slots, self._slot_ranks(), lambda: self._refresh(token_slots, size))

    def _refresh(self, token_slots: np.ndarray, size: int) -> SGMVMetadata:
        plan = self._plan(token_slots, size)
        buffer = self._buffers[size]
        buffer.copy_(torch.from_numpy(plan.packed))
        return metadata_views(buffer, plan)

    def _plan(self, token_slots: np.ndarray, size: int) -> SGMVPlan:
        max_segments = segment_capacity(size, self._num_slots)
        return plan_sgmv(token_slots, self._slot_ranks(), max_segments=max_segments,
                         max_tiles=tile_capacity(size, max_segments))
