"""engine/block_rows.py: the numpy mirror of the requests' block tables."""
from __future__ import annotations

import pytest

from loraloom.engine.block_rows import NO_ROW, BlockRows
from loraloom.engine.request import Request, SamplingParams


def request_with_blocks(index: int, blocks: list[int]) -> Request:
    request = Request(f"r{index}", [1, 2, 3], SamplingParams())
    request.block_ids = list(blocks)
    return request


def test_rows_mirror_block_ids_through_growth_and_reuse():
    rows = BlockRows(rows=2, cols=2)
    requests = [request_with_blocks(i, range(10 * i, 10 * i + i + 1)) for i in range(5)]  # 1..5 blocks
    for request in requests:
        rows.assign(request)
    assert rows.array.shape[0] >= 5 and rows.array.shape[1] >= 5  # grew in both directions
    for request in requests:
        row = rows.array[request.block_row]
        assert row[:len(request.block_ids)].tolist() == request.block_ids and not row[len(request.block_ids):].any()
    # A request gains blocks: only the new tail is written, past the current width.
    grown = requests[4]
    start = len(grown.block_ids)
    grown.block_ids += [77, 78, 79, 80]
    rows.extend(grown, start)
    assert rows.array[grown.block_row, :len(grown.block_ids)].tolist() == grown.block_ids
    # A released row is cleared, and the next request to get it sees only its own blocks.
    freed_row = requests[2].block_row
    rows.release(requests[2])
    assert requests[2].block_row == NO_ROW and not rows.array[freed_row].any()
    newcomer = request_with_blocks(9, [5])
    rows.assign(newcomer)
    assert newcomer.block_row == freed_row
    assert rows.array[freed_row].tolist() == [5] + [0] * (rows.array.shape[1] - 1)


def test_a_request_gets_one_row_at_a_time():
    rows = BlockRows()
    request = request_with_blocks(0, [1])
    rows.assign(request)
    with pytest.raises(ValueError, match="already has block row"):
        rows.assign(request)
    rows.release(request)
    rows.release(request)  # releasing twice is harmless: the request holds no row any more
    rows.assign(request)
    assert request.block_row != NO_ROW
