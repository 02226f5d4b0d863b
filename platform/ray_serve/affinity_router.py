"""The engine deployment's request router: Ray Serve's router API over affinity_rule.rank_replicas.

It runs inside each caller of the engine deployment (the gateway replicas' handles). Ray Serve's default
router keeps a multiplexed model on the replicas that hold it until they are completely full
(max_ongoing_requests), so a replacement replica received nothing of the adapters its predecessor and
the survivors held. This one spills an adapter's request to the least loaded replica once its holders
are well above it (SpilloverPolicy).

What a replica holds is what it advertises to Ray Serve (its multiplexed model ids, pushed a moment
after it loads one) joined with where this router sent the adapter recently, so a burst of a new
adapter's requests lands on one replica instead of spreading before the first load is advertised.
Load is Ray Serve's count of each replica's ongoing requests (its queue-length cache, probed when
missing).
"""
from __future__ import annotations

import time

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from loraloom.platform.ray_serve.affinity_rule import ReplicaLoad, SpilloverPolicy, rank_replicas

# How long a routing decision counts as holding until the replica advertises it. Advertising takes a
# fraction of a second, loading a large adapter a few seconds.
RECENTLY_ROUTED_S = 30.0


class AdapterAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, spill_margin: int | None = None, max_replicas_per_adapter: int | None = None) -> None:
        """`request_router_kwargs` (AppOptions.routing): the SpilloverPolicy fields; None keeps the default."""
        given = {"spill_margin": spill_margin, "max_replicas_per_adapter": max_replicas_per_adapter}
        self._policy = SpilloverPolicy(**{name: value for name, value in given.items() if value is not None})
        self._routed: dict[str, dict[ReplicaID, float]] = {}  # adapter key -> replica -> when sent there

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Every rank was offered: wait a little before offering them again (Ray Serve loops without
            # a pause otherwise).
            pending_request.routing_context.should_backoff = True
        key = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        loads = await self._ongoing_requests(candidate_replicas)
        recent = self._recently_routed(key)
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        ranks = rank_replicas(
            [ReplicaLoad(replica=replica.replica_id.unique_id, ongoing=loads[replica.replica_id],
                         holds_adapter=bool(key) and (key in replica.multiplexed_model_ids
                                                      or replica.replica_id in recent),
                         adapters_held=len(replica.multiplexed_model_ids))
             for replica in candidate_replicas],
            self._policy, has_adapter=bool(key),
        )
        return [[by_id[replica] for replica in rank] for rank in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        key = pending_request.metadata.multiplexed_model_id
        if key:
            self._routed.setdefault(key, {})[replica_id] = time.monotonic()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for replicas in self._routed.values():
            replicas.pop(replica_id, None)

    async def _ongoing_requests(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        """Each replica's ongoing requests from Ray Serve's cache; those it lacks are asked (a replica that
        does not answer in time counts as full, so it is tried last)."""
        loads = {replica.replica_id: self.replica_queue_len_cache.get(replica.replica_id) for replica in replicas}
        missing = [replica for replica in replicas if loads[replica.replica_id] is None]
        if missing:
            for replica, queue_len in await self._probe_queue_lens(missing, 0):
                loads[replica.replica_id] = queue_len
        return {replica.replica_id: replica.max_ongoing_requests if loads[replica.replica_id] is None
                else loads[replica.replica_id] for replica in replicas}

    def _recently_routed(self, key: str) -> set[ReplicaID]:
        if not key:
            return set()
        now = time.monotonic()
        replicas = self._routed.get(key, {})
        for replica, when in list(replicas.items()):
            if now - when > RECENTLY_ROUTED_S:
                del replicas[replica]
        if not replicas:
            self._routed.pop(key, None)
        return set(replicas)
