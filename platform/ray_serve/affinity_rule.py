"""Which engine replicas a request may go to, best first: adapter affinity with spillover.

Pure logic (no Ray), so the rule is tested on its own (tests/platform/ray_serve/test_affinity_rule.py);
affinity_router.py feeds it Ray Serve's view of the replicas.

An adapter's requests stay on the replicas that hold it (its weights are cached there, and batching its
requests together is cheap), unless the least loaded of those carries more than `spill_margin` requests
above the least loaded replica of all. Then the request spills to the least loaded replica, which loads
the adapter, so a replacement or newly scaled replica takes its share of the existing adapters within a
few requests instead of only receiving adapters nobody held yet. `max_replicas_per_adapter` bounds how
many replicas one adapter may spill onto: each copy takes cache and GPU slots from other adapters.
"""
from __future__ import annotations

from dataclasses import dataclass

# A GPU engine batches many requests at once: a holder this far above the idlest replica still serves
# its adapter's requests in one batch, so spilling before then would only spread adapters thin.
DEFAULT_SPILL_MARGIN = 16
DEFAULT_MAX_REPLICAS_PER_ADAPTER = 2


@dataclass(frozen=True)
class SpilloverPolicy:
    spill_margin: int = DEFAULT_SPILL_MARGIN  # ongoing requests a holder may carry above the idlest replica
    max_replicas_per_adapter: int = DEFAULT_MAX_REPLICAS_PER_ADAPTER

    def __post_init__(self) -> None:
        if self.spill_margin < 0:
            raise ValueError(f"routing.spill_margin must be >= 0, got {self.spill_margin}")
        if self.max_replicas_per_adapter < 1:
            raise ValueError(f"routing.max_replicas_per_adapter must be >= 1, got {self.max_replicas_per_adapter}")


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    ongoing: int  # requests the replica is serving or has queued
    holds_adapter: bool  # the request's adapter is loaded there (or was just sent there)
    adapters_held: int  # how many adapters it holds: among equally loaded replicas, a new one goes to the emptiest


def rank_replicas(replicas: list[ReplicaLoad], policy: SpilloverPolicy, *, has_adapter: bool) -> list[list[str]]:
    """The replicas in ranks: the caller sends the request to the least loaded replica of the first rank
    that has room, and tries later ranks only when every replica of a rank is full. A replica absent from
    every rank is not to get the request (the adapter's replica bound)."""
    if not replicas:
        return []
    by_load = sorted(replicas, key=lambda load: (load.ongoing, load.adapters_held, load.replica))
    if not has_adapter:  # the base model: every replica holds it
        return [[load.replica for load in by_load]]
    holders = [load for load in by_load if load.holds_adapter]
    others = [load for load in by_load if not load.holds_adapter]
    may_spread = len(holders) < policy.max_replicas_per_adapter
    if not holders:
        return [[load.replica for load in by_load]]
    idlest = by_load[0].ongoing
    close = [load.replica for load in holders if load.ongoing - idlest <= policy.spill_margin]
    far = [load.replica for load in holders if load.ongoing - idlest > policy.spill_margin]
    spill = [load.replica for load in others] if may_spread else []
    if close:
        return [rank for rank in (close, far, spill) if rank]
    # Every holder is well above the idlest replica: spill to it while the adapter may take another one.
    return [rank for rank in (spill, far) if rank]
