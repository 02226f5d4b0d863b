"""The embedded limiter: counters in this process's memory, for one gateway process (`loraloom
serve`). Several gateways each counting alone would each allow the whole limit: give them Redis
(redis_limiter.py). Every method runs without awaiting, so each is atomic on the event loop."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loraloom.platform.limits.limiter import (
    SLOT_RETRY_S,
    Acquired,
    BucketLevel,
    Charge,
    Slot,
    refill_rate,
    refused_first,
)


@dataclass
class _Bucket:
    level: float
    at: float


class InMemoryLimiter:
    def __init__(self, *, window_s: float, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.lease_s = lease_s
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._slots: dict[str, dict[str, float]] = {}  # key -> holder -> lease end
        self._counters: dict[str, tuple[int, float]] = {}  # key -> (value, expiry)

    def _level(self, charge: Charge, now: float) -> float:
        """The bucket's level now (a new bucket is full); refilled up to what it may hold now."""
        bucket = self._buckets.get(charge.key)
        if bucket is None:
            return charge.capacity
        refilled = bucket.level + (now - bucket.at) * refill_rate(charge.capacity, self.window_s)
        return min(charge.capacity, refilled)

    def _levels(self, charges: Sequence[Charge], levels: Sequence[float]) -> list[BucketLevel]:
        return [
            BucketLevel(capacity=charge.capacity, remaining=level,
                        reset_s=(charge.capacity - level) / refill_rate(charge.capacity, self.window_s))
            for charge, level in zip(charges, levels)
        ]

    def _holders(self, key: str, now: float) -> dict[str, float]:
        holders = self._slots.setdefault(key, {})
        for holder in [holder for holder, until in holders.items() if until <= now]:
            del holders[holder]  # leases a gateway never released
        return holders

    async def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot]) -> Acquired:
        now = self.clock()
        levels = [self._level(charge, now) for charge in charges]
        waits: list[tuple[int, float | None]] = []
        for index, (charge, level) in enumerate(zip(charges, levels)):
            if charge.amount > charge.capacity:
                waits.append((index, None))
            elif level < charge.amount:
                waits.append((index, (charge.amount - level) / refill_rate(charge.capacity, self.window_s)))
        for index, slot in enumerate(slots, start=len(charges)):
            if len(self._holders(slot.key, now)) >= slot.limit:
                waits.append((index, SLOT_RETRY_S))
        if waits:
            refused, wait = refused_first(waits)
            return Acquired(levels=self._levels(charges, levels), refused=refused, retry_after_s=wait)
        levels = [level - charge.amount for charge, level in zip(charges, levels)]
        for charge, level in zip(charges, levels):
            self._buckets[charge.key] = _Bucket(level=level, at=now)
        for slot in slots:
            self._holders(slot.key, now)[slot.holder] = now + self.lease_s
        return Acquired(levels=self._levels(charges, levels))

    async def refund(self, charge: Charge) -> None:
        now = self.clock()
        level = min(charge.capacity, self._level(charge, now) + charge.amount)
        self._buckets[charge.key] = _Bucket(level=level, at=now)

    async def release(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            self._slots.get(slot.key, {}).pop(slot.holder, None)

    async def peek(self, charges: Sequence[Charge]) -> list[BucketLevel]:
        now = self.clock()
        return self._levels(charges, [self._level(charge, now) for charge in charges])

    async def holders(self, slot: Slot) -> int:
        return len(self._holders(slot.key, self.clock()))

    async def counter(self, key: str) -> int | None:
        entry = self._counters.get(key)
        if entry is None or entry[1] <= self.clock():
            return None
        return entry[0]

    async def seed_counter(self, key: str, value: int, ttl_s: float) -> None:
        if await self.counter(key) is None:
            self._counters[key] = (value, self.clock() + ttl_s)

    async def add_to_counter(self, key: str, amount: int) -> None:
        if await self.counter(key) is not None:
            value, expiry = self._counters[key]
            self._counters[key] = (value + amount, expiry)

    async def close(self) -> None:
        pass
