"""engine/step_memo.py: a repeated adapter mix reuses its value; any change in slots or ranks makes a new one."""
from __future__ import annotations

import numpy as np

from loraloom.engine.step_memo import AdapterMixMemo


def test_memo_reuses_only_while_slots_and_ranks_repeat():
    memo: AdapterMixMemo[int] = AdapterMixMemo()
    made = []

    def make() -> int:
        made.append(len(made))
        return made[-1]

    slots = np.array([0, -1, 1, 0], np.int32)
    ranks = [8, 16, 0]
    assert memo.get("k", slots, ranks, make) == 0
    slots[1] = -1  # refilled in place with the same values: still the same mix
    assert memo.get("k", slots, ranks, make) == 0 and len(made) == 1
    slots[1] = 2  # a token moves to another slot
    assert memo.get("k", slots, ranks, make) == 1
    ranks[2] = 4  # an adapter loads into a slot: the pool changes its rank list in place
    assert memo.get("k", slots, ranks, make) == 2
    assert memo.get("k", slots[:3], ranks, make) == 3  # fewer tokens
    assert memo.get("other", slots[:3], ranks, make) == 4  # keys do not share
    assert memo.get("k", slots[:3], ranks, make) == 3
    memo.forget("k")
    assert memo.get("k", slots[:3], ranks, make) == 5
