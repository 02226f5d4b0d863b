"""One scheduled step flattened into host arrays: the batch the model runner sends to the device.

Vectorized with numpy so the host cost of a step grows with a few C-level passes over the
requests, not with Python work per token: at 256 running requests a decode step has a host
budget of about a millisecond in total. The Python loops that remain only read one attribute per
request (`np.fromiter` over a generator, or `chain.from_iterable` over the requests' own lists).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from loraloom.engine.scheduler import SchedulerOutput


@dataclass
class HostBatch:
    """The flat batch of one step. T = new tokens of the step, B = scheduled requests."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64: flat KV-cache slot (block * block_size + offset) of each new token
    token_slots: np.ndarray  # [T] int32: adapter slot of each token, -1 = base
    query_start_loc: np.ndarray  # [B + 1] int32: request b's tokens are rows [qsl[b], qsl[b+1])
    seq_lens: np.ndarray  # [B] int32: cached tokens of b after this step's writes
    block_tables: np.ndarray  # [B, max blocks of the step] int32, padded with 0
    logits_rows: np.ndarray  # [N] int64: rows whose next-token logits are sampled, in scheduled order

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def is_decode(self) -> bool:
        """Every request adds exactly one token and samples from it: the shape CUDA graphs replay."""
        return self.num_tokens == self.num_seqs and len(self.logits_rows) == self.num_seqs

    @property
    def uses_adapters(self) -> bool:
        return bool((self.token_slots >= 0).any())


def flatten_step(step: SchedulerOutput, block_size: int) -> HostBatch:
    items = step.scheduled
    count = len(items)
    num_new = np.fromiter((item.num_new_tokens for item in items), np.int64, count)
    computed = np.fromiter((item.request.num_computed_tokens for item in items), np.int64, count)
    request_slots = np.fromiter((item.slot for item in items), np.int32, count)
    samples = np.fromiter((item.sample for item in items), np.bool_, count)

    query_start_loc = np.zeros(count + 1, np.int64)
    np.cumsum(num_new, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    token_request = np.repeat(np.arange(count), num_new)  # [T]: which request each row belongs to
    # Row t of request b sits at position computed[b] + (t - qsl[b]).
    positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(computed - query_start_loc[:-1], num_new)
    input_ids = np.fromiter(
        chain.from_iterable(item.request.token_ids_between(int(start), int(start + new))
                            for item, start, new in zip(items, computed, num_new)),
        np.int64, num_tokens,
    )

    block_counts = np.fromiter((len(item.request.block_ids) for item in items), np.int64, count)
    total_blocks = int(block_counts.sum())
    flat_blocks = np.fromiter(chain.from_iterable(item.request.block_ids for item in items), np.int32, total_blocks)
    block_tables = np.zeros((count, int(block_counts.max(initial=0))), np.int32)
    first_block = np.zeros(count, np.int64)
    np.cumsum(block_counts[:-1], out=first_block[1:])
    block_tables[np.repeat(np.arange(count), block_counts),
                 np.arange(total_blocks) - np.repeat(first_block, block_counts)] = flat_blocks

    slot_mapping = (block_tables[token_request, positions // block_size].astype(np.int64) * block_size
                    + positions % block_size)
    return HostBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        token_slots=np.repeat(request_slots, num_new),
        query_start_loc=query_start_loc.astype(np.int32),
        seq_lens=(computed + num_new).astype(np.int32),
        block_tables=block_tables,
        logits_rows=query_start_loc[1:][samples] - 1,
    )
