"""Aliases split between versions by weight (canary rollouts), at the registry's level: the shares
requests get, stickiness per user (also across two lookups with caches of their own, as two gateways
have), promote and rollback in the history, and the splits refused, each naming its field. On SQLite
and PostgreSQL, with the registry service and lookup the gateway uses.

Shares are checked against binomial bounds: over n draws with probability p the count is within
4.5 standard deviations, sqrt(n p (1 - p)), of n p (a false failure about once in 150,000 runs)."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from lora_factory import make_peft_adapter
from registry_checks import parts_of

from loraloom.engine import RequestFieldError
from loraloom.platform.db.models import AliasAction
from loraloom.platform.registry.aliases import alias_history, find_alias
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.local import LocalAdapterLookup
from loraloom.platform.registry.lookup import RegistryAdapterLookup
from loraloom.platform.registry.resolution import ResolutionCache
from loraloom.platform.registry.service import RegistryService
from loraloom.platform.registry.splits import Share, routing_key
from loraloom.platform.registry.staging import UploadLimits
from loraloom.platform.training.jobs import find_checkpoint

SIGMAS = 4.5
FROZEN_CLOCK = 0.0  # cached answers never expire: only an invalidation makes a change visible


def within_binomial_bounds(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p))


def make_registry(store, served, staging: Path) -> RegistryService:
    return RegistryService(
        store=store, base=served, resolutions=ResolutionCache(capacity=1000, ttl_s=30.0, clock=lambda: FROZEN_CLOCK),
        upload_limits=UploadLimits(max_total_bytes=64 * 1024 * 1024), staging_dir=staging, presigned_expires_s=600,
    )


def make_lookup(registry: RegistryService, session_factory, served) -> RegistryAdapterLookup:
    return RegistryAdapterLookup(
        session_factory=session_factory, store=registry.store, resolutions=registry.resolutions,
        local=LocalAdapterLookup({served.name}, {}, None), find_checkpoint=find_checkpoint,
    )


@pytest.fixture
def registry(file_store, served, tmp_path: Path) -> RegistryService:
    return make_registry(file_store, served, tmp_path)


@pytest.fixture
def lookup(registry, session_factory, served) -> RegistryAdapterLookup:
    return make_lookup(registry, session_factory, served)


@pytest.fixture(scope="module")
def third_peft_adapter(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(model_dir, tmp_path_factory.mktemp("peft") / "third", rank=4, alpha=8,
                             target_modules=["q_proj"], seed=23)


@pytest.fixture
def bot(registry, session_factory, make_tenant, peft_adapter, other_peft_adapter, third_peft_adapter):
    """acme's `bot` with three versions, `prod` at version 1."""
    tenant = make_tenant(session_factory, "acme")
    for directory in (peft_adapter, other_peft_adapter, third_peft_adapter):
        with session_factory() as session:
            registry.upload_version(session, tenant_id=tenant, name="bot", actor_key_id=None, parts=parts_of(directory))
    with session_factory() as session:
        registry.move_alias(session, tenant_id=tenant, name="bot", alias="prod", number=1, actor_key_id=None)
    return tenant


def split(registry, session_factory, tenant, *shares: tuple[int, int], alias: str = "prod"):
    with session_factory() as session:
        row, handles = registry.split_alias(session, tenant_id=tenant, name="bot", alias=alias,
                                            shares=[Share(v, w) for v, w in shares], actor_key_id=None)
        return [(s.version_number, s.weight) for s in row.split], [handle.name for handle in handles]


def served_version(lookup, tenant, user: str | None = None, model: str = "bot:prod") -> int:
    named = lookup.resolve_named(model, tenant, routing_key=routing_key(user))
    assert named.handle.name == f"bot@{named.version}"
    return named.version


def test_requests_without_a_user_are_spread_by_weight(registry, lookup, session_factory, bot):
    assert split(registry, session_factory, bot, (1, 90), (2, 10)) == ([(1, 90), (2, 10)], ["bot@1", "bot@2"])
    draws = Counter(served_version(lookup, bot) for _ in range(400))
    assert set(draws) == {1, 2}
    assert within_binomial_bounds(draws[2], 400, 0.10), draws
    assert len(registry.resolutions) == 1  # the split is cached as one answer; the pick is per request

    split(registry, session_factory, bot, (1, 30), (2, 70))
    draws = Counter(served_version(lookup, bot) for _ in range(400))
    assert within_binomial_bounds(draws[2], 400, 0.70), draws
    # A bare name and name@N are untouched by prod's split.
    assert {served_version(lookup, bot, model="bot") for _ in range(20)} == {3}
    assert {served_version(lookup, bot, model="bot@1") for _ in range(20)} == {1}


def test_a_user_keeps_one_version_and_users_are_spread_by_weight(registry, lookup, session_factory, bot, served):
    split(registry, session_factory, bot, (1, 75), (2, 25))
    users = [f"user-{index}" for index in range(400)]
    first = {user: served_version(lookup, bot, user) for user in users}
    assert within_binomial_bounds(sum(v == 2 for v in first.values()), 400, 0.25)
    assert all(served_version(lookup, bot, user) == first[user] for user in users[:50])  # again: the same

    # Another gateway: its own cache and lookup over the same database picks the same version for each user.
    other = make_lookup(make_registry(registry.store, served, registry.staging_dir), session_factory, served)
    assert {user: served_version(other, bot, user) for user in users} == first


def test_moving_weights_moves_only_the_users_it_must(registry, lookup, session_factory, bot):
    users = [f"u{index}" for index in range(400)]
    split(registry, session_factory, bot, (1, 90), (2, 10))
    before = {user: served_version(lookup, bot, user) for user in users}
    split(registry, session_factory, bot, (1, 80), (2, 20))
    after = {user: served_version(lookup, bot, user) for user in users}
    moved = [user for user in users if before[user] != after[user]]
    assert all(before[user] == 1 and after[user] == 2 for user in moved)  # onto the grown version only
    assert within_binomial_bounds(len(moved), 400, 0.10), len(moved)

    # A third version takes its users from both, and nobody moves between the first two.
    split(registry, session_factory, bot, (1, 80), (2, 20), (3, 25))
    third = {user: served_version(lookup, bot, user) for user in users}
    assert all(third[user] in (after[user], 3) for user in users)
    assert within_binomial_bounds(sum(v == 3 for v in third.values()), 400, 0.20)


def test_promote_and_rollback_end_the_split_and_are_in_the_history(registry, lookup, session_factory, bot):
    split(registry, session_factory, bot, (1, 90), (2, 10))
    with session_factory() as session:
        row, handle = registry.promote_alias(session, tenant_id=bot, name="bot", alias="prod", number=None,
                                             actor_key_id=None)
        assert (row.version.number, row.split, handle.name) == (2, [], "bot@2")  # the canary, by default
    assert {served_version(lookup, bot) for _ in range(30)} == {2}

    split(registry, session_factory, bot, (2, 50), (3, 50))
    split(registry, session_factory, bot, (2, 20), (3, 80))  # changing the weights keeps what came before
    with session_factory() as session:
        row, handle = registry.rollback_alias(session, tenant_id=bot, name="bot", alias="prod", actor_key_id=None)
        assert (row.version.number, handle.name) == (2, "bot@2")
    assert {served_version(lookup, bot) for _ in range(30)} == {2}

    split(registry, session_factory, bot, (1, 1), (3, 1))
    with session_factory() as session:
        registry.promote_alias(session, tenant_id=bot, name="bot", alias="prod", number=1, actor_key_id=None)
        history = alias_history(session, tenant_id=bot, name="bot", alias="prod")
        assert find_alias(session, tenant_id=bot, name="bot", alias="prod").version.number == 1
    assert [(m.action, m.from_version, m.to_version, m.split) for m in history] == [
        (AliasAction.set, None, 1, None),
        (AliasAction.split, 1, 1, (Share(1, 90), Share(2, 10))),
        (AliasAction.promote, 1, 2, None),
        (AliasAction.split, 2, 2, (Share(2, 50), Share(3, 50))),
        (AliasAction.split, 2, 3, (Share(2, 20), Share(3, 80))),  # the version with the largest weight
        (AliasAction.rollback, 3, 2, None),
        (AliasAction.split, 2, 1, (Share(1, 1), Share(3, 1))),  # a tie: the older version
        (AliasAction.promote, 1, 1, None),
    ]


def test_promote_and_rollback_need_a_split(registry, session_factory, bot):
    with session_factory() as session:
        with pytest.raises(RegistryConflictError, match="not split"):
            registry.promote_alias(session, tenant_id=bot, name="bot", alias="prod", number=None, actor_key_id=None)
        with pytest.raises(RegistryConflictError, match="not split"):
            registry.rollback_alias(session, tenant_id=bot, name="bot", alias="prod", actor_key_id=None)
    split(registry, session_factory, bot, (1, 50), (2, 50), alias="fresh")  # created as a split
    with session_factory() as session:
        with pytest.raises(RegistryConflictError, match="created as a split"):
            registry.rollback_alias(session, tenant_id=bot, name="bot", alias="fresh", actor_key_id=None)
    split(registry, session_factory, bot, (1, 90), (2, 10))
    with session_factory() as session, pytest.raises(RequestFieldError) as refused:
        registry.promote_alias(session, tenant_id=bot, name="bot", alias="prod", number=3, actor_key_id=None)
    assert refused.value.field == "version" and "1=90,2=10" in refused.value.problem


@pytest.mark.parametrize(
    ("shares", "alias", "field", "says"),
    [
        ([(1, 100)], "prod", "split", "2 to 16 versions"),
        ([(1, 50), (1, 50)], "prod", "split[1].version", "already split[0]"),
        ([(1, 50), (9, 50)], "prod", "split[1].version", "no version 9"),
        ([(1, 50), (2, 0)], "prod", "split[1].weight", "from 1"),
        ([(1, 50), (2, 50)], "latest", "alias", "moves by itself"),
    ],
)
def test_bad_splits_are_refused_naming_the_field(registry, session_factory, bot, shares, alias, field, says):
    with pytest.raises(RequestFieldError) as refused:
        split(registry, session_factory, bot, *shares, alias=alias)
    assert refused.value.field == field and says in refused.value.problem, refused.value.problem
    with session_factory() as session:
        assert find_alias(session, tenant_id=bot, name="bot", alias="prod").split == []  # nothing changed


def test_another_tenants_adapter_cannot_be_split(registry, lookup, session_factory, make_tenant, bot):
    globex = make_tenant(session_factory, "globex")
    with pytest.raises(RegistryNotFoundError):
        split(registry, session_factory, globex, (1, 50), (2, 50))
    with session_factory() as session, pytest.raises(RegistryNotFoundError):
        registry.promote_alias(session, tenant_id=globex, name="bot", alias="prod", number=None, actor_key_id=None)
    assert {served_version(lookup, bot) for _ in range(20)} == {1}


def test_a_version_in_a_split_is_deleted_only_with_force(registry, lookup, session_factory, bot):
    split(registry, session_factory, bot, (1, 90), (2, 10))
    with session_factory() as session:
        with pytest.raises(RegistryConflictError, match="prod"):
            registry.delete_version(session, tenant_id=bot, name="bot", number=2, force=False, actor_key_id=None,
                                    unload=lambda key: None)
    with session_factory() as session:
        registry.delete_version(session, tenant_id=bot, name="bot", number=2, force=True, actor_key_id=None,
                                unload=lambda key: None)
        with pytest.raises(RegistryNotFoundError):
            find_alias(session, tenant_id=bot, name="bot", alias="prod")
        assert alias_history(session, tenant_id=bot, name="bot", alias="prod")[-1].action is AliasAction.delete
