"""One scheduled step flattened into host arrays: the batch the model runner sends to the device.

Vectorized with numpy so the host cost of a step grows with a few C-level passes over the
requests, not with Python work per token: at 256 running requests a decode step has a host
budget of about a millisecond in total. The Python loops that remain read an attribute or two per
request (`np.fromiter` over a generator); block tables are gathered from the block manager's
persistent numpy rows (engine/block_rows.py), not copied from each request's list.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from loraloom.engine.scheduler import ScheduledRequest, SchedulerOutput


@dataclass
class HostBatch:
    """The flat batch of one step. T = new tokens of the step, B = scheduled requests."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64: flat KV-cache slot (block * block_size + offset) of each new token
    token_slots: np.ndarray  # [T] int32: adapter slot of each token, -1 = base
    query_start_loc: np.ndarray  # [B + 1] int32: request b's tokens are rows [qsl[b], qsl[b+1])
    seq_lens: np.ndarray  # [B] int32: cached tokens of b after this step's writes
    block_tables: np.ndarray  # [B, blocks read by the step's longest request] int32, padded with 0
    # [N] int64: rows whose next-token logits are sampled, in scheduled order: a request's last row, or
    # for a request verifying a draft its last 1 + len(draft) rows (engine/speculation/verify.py)
    logits_rows: np.ndarray

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


def _new_token_ids(items: list[ScheduledRequest]) -> Iterator[int]:
    """The tokens each item computes, in order: token ids [computed, computed + num_new) of its request."""
    for item in items:
        request = item.request
        if item.sample and item.num_new_tokens == 1 and request.output_token_ids:
            yield request.output_token_ids[-1]  # a decode: it computes the token sampled last step
        else:  # a prefill chunk, or a request's last token followed by its draft's proposals
            start = request.num_computed_tokens
            yield from request.token_ids_between(start, start + item.num_new_tokens - len(item.draft))
            yield from item.draft


def flatten_step(step: SchedulerOutput, block_size: int) -> HostBatch:
    items = step.scheduled
    count = len(items)
    num_new = np.fromiter((item.num_new_tokens for item in items), np.int64, count)
    computed = np.fromiter((item.request.num_computed_tokens for item in items), np.int64, count)
    request_slots = np.fromiter((item.slot for item in items), np.int32, count)
    # Rows sampled per request: none, its last, or its last 1 + len(draft).
    sampled_rows = np.fromiter((item.sample + len(item.draft) for item in items), np.int64, count)

    query_start_loc = np.zeros(count + 1, np.int64)
    np.cumsum(num_new, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    token_request = np.repeat(np.arange(count), num_new)  # [T]: which request each row belongs to
    # Row t of request b sits at position computed[b] + (t - qsl[b]).
    positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(computed - query_start_loc[:-1], num_new)
    input_ids = np.fromiter(_new_token_ids(items), np.int64, num_tokens)

    seq_lens = computed + num_new
    # Only the blocks this step reads: a request may hold blocks for tokens it computes later.
    num_cols = -(-int(seq_lens.max(initial=0)) // block_size)
    block_rows = np.fromiter((item.request.block_row for item in items), np.int64, count)
    block_tables = step.block_table[block_rows, :num_cols]  # a gather: one copy, no per-request work

    slot_mapping = (block_tables[token_request, positions // block_size].astype(np.int64) * block_size
                    + positions % block_size)
    return HostBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        token_slots=np.repeat(request_slots, num_new),
        query_start_loc=query_start_loc.astype(np.int32),
        seq_lens=seq_lens.astype(np.int32),
        block_tables=block_tables,
        logits_rows=_sampled_rows(query_start_loc[1:], sampled_rows),
    )


def _sampled_rows(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The last counts[b] rows of each request b (whose rows end before ends[b]), in order."""
    total = int(counts.sum())
    if total == len(counts):  # one per request: no draft in the step, every request samples
        return ends - 1
    firsts = np.repeat(ends - counts, counts)
    group_starts = np.repeat(np.cumsum(counts) - counts, counts)
    return firsts + (np.arange(total) - group_starts)
