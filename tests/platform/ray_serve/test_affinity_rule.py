"""The routing rule of the engine deployment (affinity_rule.rank_replicas), as pure logic: an adapter's
requests stay with the replicas holding it until those are well above the idlest replica, then spill to
the idlest (a replacement, say), never onto more replicas than the policy's bound."""
from __future__ import annotations

import pytest

from loraloom.platform.ray_serve.affinity_rule import ReplicaLoad, SpilloverPolicy, rank_replicas

POLICY = SpilloverPolicy(spill_margin=4, max_replicas_per_adapter=2)


def load(replica: str, ongoing: int, holds: bool = False, held: int = 0) -> ReplicaLoad:
    return ReplicaLoad(replica=replica, ongoing=ongoing, holds_adapter=holds, adapters_held=held)


def first_choice(ranks: list[list[str]]) -> str:
    """Where the request goes when nobody is full: the first replica of the first rank (ranks list
    their replicas least loaded first, as the caller picks within a rank)."""
    return ranks[0][0]


def test_a_holder_within_the_margin_keeps_its_adapter():
    ranks = rank_replicas([load("survivor", 4, holds=True, held=3), load("replacement", 0)], POLICY, has_adapter=True)
    assert ranks == [["survivor"], ["replacement"]]


def test_a_holder_well_above_the_idlest_spills_to_the_idlest():
    replicas = [load("survivor", 5, holds=True, held=3), load("busy", 9), load("replacement", 0)]
    ranks = rank_replicas(replicas, POLICY, has_adapter=True)
    assert first_choice(ranks) == "replacement"
    assert ranks == [["replacement", "busy"], ["survivor"]]  # the holder stays a fallback for full spill targets


def test_once_the_adapter_is_on_two_replicas_the_least_loaded_holder_serves_it():
    replicas = [load("survivor", 6, holds=True), load("replacement", 1, holds=True), load("third", 0)]
    ranks = rank_replicas(replicas, POLICY, has_adapter=True)
    assert first_choice(ranks) == "replacement"
    assert "third" not in {replica for rank in ranks for replica in rank}  # the bound: two replicas at most


def test_at_the_bound_a_loaded_adapter_stays_on_its_replicas():
    replicas = [load("a", 20, holds=True), load("b", 18, holds=True), load("idle", 0)]
    assert rank_replicas(replicas, POLICY, has_adapter=True) == [["b", "a"]]


def test_a_bound_of_one_never_spreads_an_adapter():
    policy = SpilloverPolicy(spill_margin=0, max_replicas_per_adapter=1)
    assert rank_replicas([load("a", 50, holds=True), load("b", 0)], policy, has_adapter=True) == [["a"]]


def test_a_new_adapter_goes_to_the_idlest_replica_then_the_emptiest():
    replicas = [load("full-of-adapters", 0, held=7), load("loaded", 3), load("empty", 0, held=1)]
    ranks = rank_replicas(replicas, POLICY, has_adapter=True)
    assert ranks == [["empty", "full-of-adapters", "loaded"]]


def test_base_requests_go_to_the_idlest_replica():
    replicas = [load("a", 3, held=1), load("b", 1, held=5)]
    assert rank_replicas(replicas, POLICY, has_adapter=False) == [["b", "a"]]


def test_no_replicas_no_ranks():
    assert rank_replicas([], POLICY, has_adapter=True) == []


@pytest.mark.parametrize(("field", "value"), [("spill_margin", -1), ("max_replicas_per_adapter", 0)])
def test_a_bad_policy_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"routing.{field}"):
        SpilloverPolicy(**{field: value})
