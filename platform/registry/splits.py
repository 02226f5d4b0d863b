"""An alias split between versions by weight (a canary rollout), and which version a request gets.

A request naming a split alias gets one of its versions with probability weight / total. With the
request's `user`, the choice is sticky: a stable hash of (tenant, adapter:alias, user) decides it,
so the same user lands on the same version of a given split in every request and every gateway;
without one, each request draws afresh.

The draw is weighted rendezvous hashing: each version scores -ln(u) / weight, u a uniform number
hashed from the key and the version's number, and the lowest score wins. The lowest of such
exponentials is version v's with probability w_v / sum(w), and a user's scores do not depend on the
other versions' weights, so raising one version's weight moves users only onto it, lowering it moves
users only off it, and adding a version moves onto it only the users it wins: no user is shuffled
between versions whose weights did not change (a cumulative split of [0, 1) by version order would
move users between two untouched versions whenever one in front of them changes).
"""
from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from loraloom.engine import RequestFieldError

MIN_SPLIT_VERSIONS = 2
MAX_SPLIT_VERSIONS = 16  # a rollout compares a few versions; past this it is a mistake, not a split
MAX_SPLIT_WEIGHT = 1_000_000


@dataclass(frozen=True)
class Share:
    """One version of a split and its integer weight."""

    version: int
    weight: int


def check_shares(shares: Sequence[Share]) -> None:
    """Raise RequestFieldError naming the field (`split`, `split[1].version`) a split breaks a rule with.
    Whether each version exists is the registry's to check."""
    if not MIN_SPLIT_VERSIONS <= len(shares) <= MAX_SPLIT_VERSIONS:
        raise RequestFieldError(
            "split", f"a split names {MIN_SPLIT_VERSIONS} to {MAX_SPLIT_VERSIONS} versions, got {len(shares)}; "
            'to point the alias at one version send {"version": N} instead'
        )
    seen: dict[int, int] = {}
    for index, share in enumerate(shares):
        if share.version in seen:
            raise RequestFieldError(
                f"split[{index}].version", f"version {share.version} is already split[{seen[share.version]}]; "
                "name each version once, with its whole weight"
            )
        seen[share.version] = index
        if not 1 <= share.weight <= MAX_SPLIT_WEIGHT:
            raise RequestFieldError(
                f"split[{index}].weight", f"a weight is an integer from 1 to {MAX_SPLIT_WEIGHT}, got {share.weight}; "
                "leave a version out of the split rather than give it no weight"
            )


def describe(shares: Sequence[Share]) -> str:
    """`3=90,4=10`: a split as the CLI writes it, for messages."""
    return ",".join(f"{share.version}={share.weight}" for share in shares)


def routing_key(user: str | None) -> str:
    """What a request's version is chosen by: its `user` (sticky), else a key of its own (a fresh draw).
    Made once per request, so every resolution within it (`model` and `adapter_id`) agrees."""
    return f"user\x00{user}" if user else f"request\x00{uuid.uuid4().hex}"


def choose(numbers: Sequence[int], weights: Sequence[int], *, scope: str, key: str | None) -> int:
    """The index of the version (by number, with its weight) that `key` gets in the split `scope` names
    (tenant and adapter:alias); a fresh key (a random draw) when `key` is None."""
    if len(numbers) == 1:
        return 0
    point = f"{scope}\x00{key if key is not None else routing_key(None)}"
    scores = [-math.log(_unit(f"{point}\x00{number}")) / weight for number, weight in zip(numbers, weights)]
    return min(range(len(scores)), key=scores.__getitem__)


def _unit(text: str) -> float:
    """A number in (0, 1) from `text`: 53 bits of its SHA-256, uniform over a key space no one chooses."""
    bits = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "big") >> 11
    return (bits + 0.5) / (1 << 53)
