"""The board where engine replicas post their own status, for the gateways to read.

A Ray Serve handle reaches *a* replica, never a chosen one, so no gateway can ask each replica in
turn. Instead each replica posts its status (stats and resident adapters) here whenever it changes
in a way a reader cares about: an adapter loaded or unloaded, a request's first output, a request's
end (posted before that last output is sent, so a client that has its answer reads a board that
counts it). A replica that dies leaves its last post; readers drop the posts of replicas whose
actor is gone (`live_posts`).
"""
from __future__ import annotations

import asyncio

import ray

from loraloom.platform.ray_serve.wire import ReplicaStatus

BOARD_NAME = "loraloom-replica-board"
BOARD_NAMESPACE = "loraloom"
LIVENESS_TIMEOUT_S = 2.0  # a ping unanswered this long keeps the post: the replica is busy, not known dead


@ray.remote(num_cpus=0)
class ReplicaBoard:
    def __init__(self) -> None:
        self._posts: dict[str, tuple[ray.actor.ActorHandle | None, ReplicaStatus]] = {}

    def post(self, status: ReplicaStatus, actor: ray.actor.ActorHandle | None) -> None:
        _, latest = self._posts.get(status.replica, (None, None))
        if latest is None or latest.sequence < status.sequence:
            self._posts[status.replica] = (actor, status)

    def actor_of(self, replica: str) -> ray.actor.ActorHandle | None:
        """The replica's actor (operators and tests stop one with ray.kill)."""
        actor, _ = self._posts.get(replica, (None, None))
        return actor

    async def live_posts(self) -> list[ReplicaStatus]:
        """Every replica's latest post, but those of replicas whose actor has died (forgotten here)."""
        alive = []
        for replica, (actor, status) in list(self._posts.items()):
            if actor is not None:
                try:
                    await asyncio.wait_for(actor.__ray_ready__.remote(), LIVENESS_TIMEOUT_S)
                except asyncio.TimeoutError:
                    pass
                except ray.exceptions.RayActorError:
                    self._posts.pop(replica, None)
                    continue
            alive.append(status)
        return sorted(alive, key=lambda status: status.replica)


def replica_board() -> ray.actor.ActorHandle:
    """The board of this Ray cluster, made by whoever asks first. Detached: it must outlive the
    replica that made it, since the others keep posting to it."""
    return ReplicaBoard.options(
        name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
