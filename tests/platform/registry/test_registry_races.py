"""Issue 12 items 5 and 6, on PostgreSQL and SQLite with real concurrency (threads, each with its own session
and connection, started together at a barrier):

- an alias moving onto a version while that version is deleted left the alias on the deleted version
  (both succeeded, 4 of 4 tries): now exactly one of them wins;
- concurrent promotions read the alias's current version without a lock, so history entries did not
  chain (25 of 47): now each entry's from_version is the previous entry's to_version.

The adapter's row is locked (SELECT ... FOR UPDATE; on SQLite the file's writer lock, db/locking.py)
by every change to its versions and aliases."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry_checks import run_together, upload_dir, with_alpha
from sqlalchemy import select

from loraloom.platform.db.models import AdapterVersion, AdapterVersionStatus, Alias
from loraloom.platform.registry.aliases import alias_history, move_alias
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError
from loraloom.platform.registry.versions import delete_version

ROUNDS = 20
PROMOTIONS = 48
NAME = "support-bot"

def test_an_alias_never_points_at_a_version_deleted_at_the_same_time(
    session_factory, file_store, served, make_tenant, peft_adapter, tmp_path
):
    tenant = make_tenant(session_factory, "acme")
    upload_dir(session_factory, file_store, served, tenant, peft_adapter)  # version 1 stays: latest falls back to it

    def promote(number: int) -> Callable[[], Any]:
        def call() -> Any:
            with session_factory() as session:
                return move_alias(session, tenant_id=tenant, name=NAME, alias="canary", number=number, actor_key_id=None)
        return call

    def delete(number: int) -> Callable[[], Any]:
        def call() -> Any:
            with session_factory() as session:
                return delete_version(session, tenant_id=tenant, name=NAME, number=number, force=False, actor_key_id=None)
        return call

    for round_number in range(ROUNDS):
        fresh = with_alpha(peft_adapter, tmp_path, alpha=100 + round_number)  # a new version each round
        number = upload_dir(session_factory, file_store, served, tenant, fresh).number
        moved, deleted = run_together(promote(number), delete(number))
        # Exactly one wins: the move first (the delete then sees the alias: 409), or the delete
        # first (the move then finds no such version: 404).
        assert (isinstance(moved, RegistryNotFoundError)) != (isinstance(deleted, RegistryConflictError)), (moved, deleted)
        assert not isinstance(moved, Exception) or isinstance(moved, RegistryNotFoundError), moved
        assert not isinstance(deleted, Exception) or isinstance(deleted, RegistryConflictError), deleted
        with session_factory() as session:
            on_deleted = session.scalars(
                select(Alias.name).join(AdapterVersion, Alias.version_id == AdapterVersion.id)
                .where(AdapterVersion.status == AdapterVersionStatus.deleted)
            ).all()
        assert on_deleted == [], f"alias(es) {on_deleted} point at a deleted version"


def test_concurrent_promotions_leave_a_history_that_chains(
    session_factory, file_store, served, make_tenant, peft_adapter, other_peft_adapter, tmp_path
):
    tenant = make_tenant(session_factory, "acme")
    for directory in (peft_adapter, other_peft_adapter, with_alpha(peft_adapter, tmp_path, alpha=100),
                      with_alpha(other_peft_adapter, tmp_path, alpha=100)):
        upload_dir(session_factory, file_store, served, tenant, directory)

    def promote(number: int) -> Callable[[], Any]:
        def call() -> Any:
            with session_factory() as session:
                return move_alias(session, tenant_id=tenant, name=NAME, alias="prod", number=number, actor_key_id=None)
        return call

    results = run_together(*(promote(1 + i % 4) for i in range(PROMOTIONS)))
    assert not [r for r in results if isinstance(r, Exception)], results
    with session_factory() as session:
        moves = alias_history(session, tenant_id=tenant, name=NAME, alias="prod")
        current = session.scalar(select(Alias).where(Alias.name == "prod")).version.number
    assert moves[0].from_version is None
    broken = [(i, before.to_version, after.from_version) for i, (before, after) in enumerate(zip(moves, moves[1:]))
              if after.from_version != before.to_version]
    assert broken == [], f"{len(broken)} of {len(moves) - 1} history entries do not chain: {broken[:5]}"
    assert moves[-1].to_version == current
    assert all(move.from_version != move.to_version for move in moves)
