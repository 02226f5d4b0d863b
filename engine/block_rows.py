"""Every block-holding request's block table as one row of a numpy array.

`request.block_ids` (a list) stays the block manager's source of truth; this array mirrors
it so that the runner can gather a whole step's block tables with one numpy index
instead of copying every request's list each step. The mirror is written only when a
request's table changes (allocation, growth by a block, release), so a decode step, in
which a request gains a block once every `block_size` tokens, writes almost nothing.

Rows beyond a request's blocks are zero: a released row is cleared before reuse.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from loraloom.engine.request import Request

NO_ROW = -1


class BlockRows:
    def __init__(self, rows: int = 64, cols: int = 16) -> None:
        self.array = np.zeros((rows, cols), np.int32)  # [rows, cols]; grows, so read it through this attribute
        self._free_rows = list(range(rows - 1, -1, -1))  # popped from the end: lowest row first

    @classmethod
    def of(cls, requests: Iterable[Request]) -> "BlockRows":
        """Rows for requests whose block_ids were set by hand (tests, the memory profile) rather than by a BlockManager."""
        rows = cls()
        for request in requests:
            rows.assign(request)
        return rows

    def assign(self, request: Request) -> None:
        """Give `request` a row holding its current block_ids."""
        if request.block_row != NO_ROW:
            raise ValueError(f"request {request.request_id!r}: already has block row {request.block_row}")
        if not self._free_rows:
            self._grow_rows()
        request.block_row = self._free_rows.pop()
        self.extend(request, 0)

    def extend(self, request: Request, start: int) -> None:
        """Copy request.block_ids[start:] (blocks it just gained) into its row."""
        blocks = request.block_ids
        if len(blocks) > self.array.shape[1]:
            self._grow_cols(len(blocks))
        self.array[request.block_row, start:len(blocks)] = blocks[start:]

    def release(self, request: Request) -> None:
        """Clear and free `request`'s row; call before its block_ids are emptied."""
        row = request.block_row
        if row == NO_ROW:
            return
        self.array[row, :len(request.block_ids)] = 0
        self._free_rows.append(row)
        request.block_row = NO_ROW

    def _grow_rows(self) -> None:
        old = self.array.shape[0]
        self.array = np.concatenate([self.array, np.zeros_like(self.array)])
        self._free_rows.extend(range(2 * old - 1, old - 1, -1))

    def _grow_cols(self, needed: int) -> None:
        cols = self.array.shape[1]
        while cols < needed:
            cols *= 2
        grown = np.zeros((self.array.shape[0], cols), np.int32)
        grown[:, :self.array.shape[1]] = self.array
        self.array = grown
