"""Which runtime adapter key sits in which GPU slot, and who is using it.

Pure bookkeeping: the scheduler decides residency here and emits
(slot, adapter) loads; engine/lora/layers.py copies the weights. A slot's reference
count is the number of running requests that use its adapter; only a slot
with no references may be given to another adapter, and the one acquired
least recently goes first.
"""
from __future__ import annotations

import itertools
import logging

from loraloom.engine.lora.files import runtime_key_scope

logger = logging.getLogger(__name__)


class AdapterSlotTable:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"max_loras: must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._key_in_slot: list[str | None] = [None] * num_slots
        self._slot_of_key: dict[str, int] = {}
        self._ref_counts = [0] * num_slots
        # Tick of each slot's latest acquire: the recency both eviction and
        # draining use, so an adapter in steady use is never the one picked.
        self._last_acquired = [-1] * num_slots
        self._clock = itertools.count()
        # Since start: adapters copied into a slot, and those copies that replaced another adapter.
        self.loads = 0
        self.evictions = 0

    @property
    def num_used(self) -> int:
        """Slots holding an adapter (in use or idle but still loaded)."""
        return len(self._slot_of_key)

    def resident_keys(self) -> list[str]:
        return list(self._slot_of_key)

    def lookup(self, key: str) -> int | None:
        return self._slot_of_key.get(key)

    def ref_count(self, key: str) -> int:
        slot = self._slot_of_key.get(key)
        return 0 if slot is None else self._ref_counts[slot]

    def can_acquire(self, key: str) -> bool:
        return key in self._slot_of_key or self._free_slot() is not None

    def acquire(self, key: str) -> tuple[int, bool] | None:
        """(slot, needs_load) with one more reference on the slot, or None when every slot is in use."""
        slot = self._slot_of_key.get(key)
        needs_load = slot is None
        if needs_load:
            slot = self._free_slot()
            if slot is None:
                return None
            evicted = self._key_in_slot[slot]
            if evicted is not None:
                del self._slot_of_key[evicted]
                self.evictions += 1
                # Frequent evictions mean more adapters in use than slots (--max-loras): operators look here.
                logger.info("adapter %s evicted from slot %d", evicted, slot,
                            extra={"adapter_key": evicted, "tenant": runtime_key_scope(evicted), "slot": slot,
                                   "replaced_by": key})
            self.loads += 1
            self._key_in_slot[slot] = key
            self._slot_of_key[key] = slot
        self._ref_counts[slot] += 1
        self._last_acquired[slot] = next(self._clock)
        return slot, needs_load

    def release(self, key: str) -> None:
        slot = self._slot_of_key.get(key)
        if slot is None or self._ref_counts[slot] == 0:
            raise ValueError(f"adapter {key!r}: released more often than acquired")
        self._ref_counts[slot] -= 1

    def drain_candidate(self) -> str | None:
        """The in-use adapter whose slot a slot-blocked request should wait for: the least recently acquired.

        While the scheduler admits nothing new onto it, it stays the least
        recently acquired, so the choice is stable from step to step and the
        slot empties once its running requests finish.
        """
        busy = [slot for slot in range(self.num_slots) if self._ref_counts[slot] > 0]
        if not busy:
            return None
        return self._key_in_slot[min(busy, key=self._last_acquired.__getitem__)]

    def _free_slot(self) -> int | None:
        """The least recently acquired slot nobody references (never-used slots first), else None."""
        idle = [slot for slot in range(self.num_slots) if self._ref_counts[slot] == 0]
        return min(idle, key=self._last_acquired.__getitem__) if idle else None
