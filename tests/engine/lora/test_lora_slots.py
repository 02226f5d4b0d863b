"""AdapterSlotTable: residency, reference counts, LRU eviction of idle slots, drain choice."""
from __future__ import annotations

import random

import pytest

from loraloom.engine.lora.slots import AdapterSlotTable


def test_resident_key_shares_its_slot_and_loads_once():
    table = AdapterSlotTable(2)
    slot, needs_load = table.acquire("a")
    assert needs_load and table.lookup("a") == slot
    assert table.acquire("a") == (slot, False)
    assert table.ref_count("a") == 2 and table.num_used == 1


def test_full_table_refuses_until_a_slot_is_idle_then_evicts_least_recently_acquired():
    table = AdapterSlotTable(2)
    slot_a, _ = table.acquire("a")
    slot_b, _ = table.acquire("b")
    assert not table.can_acquire("c") and table.acquire("c") is None
    table.release("b")
    table.release("a")  # both idle; "a" was acquired first, so it is the one to go
    assert table.acquire("c") == (slot_a, True)
    assert table.lookup("a") is None and table.lookup("b") == slot_b
    assert sorted(table.resident_keys()) == ["b", "c"]
    assert table.acquire("b") == (slot_b, False)  # an idle resident key comes back without a load


def test_drain_candidate_is_the_busy_slot_acquired_least_recently():
    table = AdapterSlotTable(3)
    for key in ["a", "b", "c"]:
        table.acquire(key)
    table.acquire("a")  # refreshes "a": now "b" is the oldest acquisition
    assert table.drain_candidate() == "b"
    for _ in range(2):
        table.release("a")
    assert table.drain_candidate() == "b"  # idle slots are not candidates (they are free to take)
    assert AdapterSlotTable(2).drain_candidate() is None


def test_release_without_acquire_fails_loudly():
    table = AdapterSlotTable(1)
    with pytest.raises(ValueError, match="released more often"):
        table.release("a")


def test_random_operations_match_a_plain_model():
    """Against a brute-force model: refs per key, resident set, LRU by acquire time among idle slots."""
    rng = random.Random(7)
    table = AdapterSlotTable(3)
    refs: dict[str, int] = {}
    last_acquired: dict[str, int] = {}
    resident: set[str] = set()
    for clock in range(2000):
        key = f"k{rng.randrange(6)}"
        if rng.random() < 0.5 and refs.get(key, 0) > 0:
            table.release(key)
            refs[key] -= 1
            continue
        idle = [k for k in resident if refs.get(k, 0) == 0]
        if key in resident:
            expected_load = False
        elif len(resident) < 3:
            expected_load = True
        elif idle:
            expected_load = True
            resident.remove(min(idle, key=last_acquired.__getitem__))
        else:
            assert table.acquire(key) is None
            continue
        result = table.acquire(key)
        assert result is not None and result[1] == expected_load
        resident.add(key)
        refs[key] = refs.get(key, 0) + 1
        last_acquired[key] = clock
        assert set(table.resident_keys()) == resident
        assert len({table.lookup(k) for k in resident}) == len(resident)
        assert all(table.ref_count(k) == refs.get(k, 0) for k in resident)
