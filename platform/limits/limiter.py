"""The limiter's one interface, whichever backend keeps its counters.

Three kinds of counter:
- token buckets (requests and tokens per minute): a bucket holds at most `capacity` and refills at
  capacity per window, continuously; a charge takes from it, a refund puts back (never above full);
- concurrency slots: at most `limit` holders at once, each released by name (a holder a dead
  gateway never released stops counting after a lease);
- usage counters (the monthly quota): a running sum, seeded once from the usage table.

`acquire` is all or nothing: either every bucket is charged and every slot taken, or nothing
changes and the answer says which counter refused and when a retry can succeed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# A refused slot frees up when some request ends, which no counter predicts: retry after this long.
SLOT_RETRY_S = 1.0


class LimiterUnavailableError(RuntimeError):
    """The limiter's store cannot be reached (Redis is down): the gateway admits without limits
    rather than refusing every request, and says so in its log."""


@dataclass(frozen=True)
class Charge:
    """Take `amount` from the bucket `key`, which holds at most `capacity`."""

    key: str
    capacity: float
    amount: float


@dataclass(frozen=True)
class Slot:
    """Hold one of the `limit` slots of `key` under the name `holder`."""

    key: str
    limit: int
    holder: str


@dataclass(frozen=True)
class BucketLevel:
    """A bucket after a charge (or as it is, for a peek): what is left, and how long until it is full."""

    capacity: float
    remaining: float
    reset_s: float


@dataclass(frozen=True)
class Acquired:
    """`acquire`'s answer. `levels` follows the charges (after charging, or as they were when refused);
    `refused` indexes charges then slots (None: all taken); `retry_after_s` is when the refusing
    counter would allow it (None: never, the charge is larger than the bucket)."""

    levels: list[BucketLevel]
    refused: int | None = None
    retry_after_s: float | None = 0.0

    @property
    def ok(self) -> bool:
        return self.refused is None


class Limiter(Protocol):
    window_s: float  # the time a bucket takes to refill from empty: a minute, shorter in tests

    async def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot]) -> Acquired: ...

    async def refund(self, charge: Charge) -> None:
        """Put `charge.amount` back (a negative amount takes more), never above capacity."""

    async def release(self, slots: Sequence[Slot]) -> None: ...

    async def peek(self, charges: Sequence[Charge]) -> list[BucketLevel]:
        """The buckets' levels now, charging nothing (the amounts are ignored)."""

    async def holders(self, slot: Slot) -> int:
        """How many hold `slot.key` now."""

    async def counter(self, key: str) -> int | None:
        """A usage counter's value; None if it was never seeded."""

    async def seed_counter(self, key: str, value: int, ttl_s: float) -> None:
        """Start the counter at `value` unless it exists (another request seeded it first)."""

    async def add_to_counter(self, key: str, amount: int) -> None:
        """Add to a seeded counter; an unseeded one stays unseeded (its seed will count this usage)."""

    async def close(self) -> None: ...


def refill_rate(capacity: float, window_s: float) -> float:
    return capacity / window_s


def refused_first(waits: Sequence[tuple[int, float | None]]) -> tuple[int, float | None]:
    """Of the refusing counters (index, wait), the one a retry must wait for longest: a charge that
    never fits (None) first."""
    return max(waits, key=lambda item: float("inf") if item[1] is None else item[1])
