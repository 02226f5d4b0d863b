"""A succeeded job's promotion (promotion.py's `promote`), as its worker carries it out.

`valid_loss_improves` in two halves. Before the job's version is published, `read_gate` reads what the
alias names now and measures each of those versions' validation loss on the job's validation file, with
the job's own objective (gate_evaluation.py, handed in as `losses_of`). An alias split between versions
is compared version by version: the job's version must beat each of them, i.e. the lowest loss among
them, since the move replaces the whole split. After publishing, `promote` takes the adapter's lock and,
if the alias still names what was measured, moves it to the job's version only when the version's
`full_valid_loss` (the trainer's measure of the very weights published) is strictly lower; otherwise it
records the refusal. An alias that does not exist yet is created at the job's version (nothing to compare).

`always` moves the alias without measuring anything. A move goes through the registry's `move_alias`
(history, and the change announced to every gateway's listener); a refusal is a history entry of its
own (`gate_refused`). Either way the job gets one `promotion` event saying what was compared and decided.

The gate never fails the job: a version that cannot be fetched or evaluated, an alias moved by someone
else while the gate measured, any error of its own, and the promotion is `skipped`, the event says why,
and the job succeeds with its version published.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraloom.engine import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from loraloom.platform.db.aliases import JobNote
from loraloom.platform.db.models import AdapterVersion, AdapterVersionFile, AliasAction
from loraloom.platform.registry.aliases import AliasTarget, alias_target, keep_alias, move_alias
from loraloom.platform.registry.versions import find_adapter
from loraloom.platform.storage import BlobStore, content_key
from loraloom.platform.training.job_state import add_event
from loraloom.platform.training.promotion import ALWAYS, Promotion

logger = logging.getLogger(__name__)
EVENT_TYPE = "promotion"
PROMOTED, REFUSED, SKIPPED, UNCHANGED = "promoted", "refused", "skipped", "unchanged"

# version number -> its PEFT directory, to version number -> its valid_loss
LossesOf = Callable[[Mapping[int, Path]], dict[int, float]]


@dataclass(frozen=True)
class GateReading:
    """What the gate measured before the job's version was published."""

    target: AliasTarget | None  # what the alias named; None: it did not exist
    losses: dict[int, float] = field(default_factory=dict)  # each of its versions' valid_loss
    problem: str | None = None  # why nothing could be measured: the promotion is skipped


@dataclass(frozen=True)
class JobPromotion:
    """Who promotes what: the job, its tenant and adapter, and the key that created the job."""

    job_id: str
    tenant_id: uuid.UUID
    adapter: str
    actor_key_id: uuid.UUID | None
    promotion: Promotion


def read_gate(
    factory: sessionmaker[Session], store: BlobStore, job: JobPromotion, work_dir: Path, losses_of: LossesOf
) -> GateReading:
    """The alias's versions now and their validation losses; a GateReading with a `problem`, never an
    exception, when they cannot be measured."""
    target = None
    try:
        with factory() as session:
            target = alias_target(session, tenant_id=job.tenant_id, name=job.adapter, alias=job.promotion.alias)
            if target is None:
                return GateReading(target=None)
            files = _version_files(session, job, target.versions)
        directories = {}
        for number, digests in files.items():
            directory = directories[number] = work_dir / f"version-{number}"
            for filename, sha256 in digests.items():
                store.get_to_path(content_key(sha256), directory / filename)
        return GateReading(target=target, losses=losses_of(directories))
    except Exception as error:  # the gate's failure is not the job's
        logger.exception("job %s: the promotion gate could not evaluate %s:%s", job.job_id, job.adapter,
                         job.promotion.alias, extra={"job_id": job.job_id})
        versions = "" if target is None else f" ({_listed(target.versions)})"
        return GateReading(target=target, problem=f"the versions the alias names{versions} could not be evaluated: "
                                                  f"{_shown(error)}")


def promote(
    factory: sessionmaker[Session], job: JobPromotion, *, number: int, new_loss: float | None,
    reading: GateReading | None,
) -> None:
    """Move the alias to version `number` (or record why not), and add the job's `promotion` event.
    `reading` is read_gate's (None for `always`). Never raises."""
    alias = job.promotion.alias
    data: dict[str, Any] = {"adapter": job.adapter, "alias": alias, "when": job.promotion.when, "new_version": number,
                            "from_version": None, "to_version": None, "new_valid_loss": new_loss,
                            "current_valid_loss": None, "compared": []}
    try:
        with factory() as session:
            now = alias_target(session, tenant_id=job.tenant_id, name=job.adapter, alias=alias, lock=True)
            data["from_version"] = None if now is None else now.version
            message = _decide_and_record(session, job, number, new_loss, reading, now, data)
    except Exception as error:  # the job has succeeded: its promotion failing must not change that
        logger.exception("job %s: promoting %s:%s failed", job.job_id, job.adapter, alias, extra={"job_id": job.job_id})
        data.update(decision=SKIPPED, to_version=None, reason=_shown(error))
        message = _skipped_message(job, data["reason"])
    try:
        with factory.begin() as session:
            add_event(session, job.job_id, message, level="warn" if data["decision"] == SKIPPED else "info",
                      type=EVENT_TYPE, data=data)
    except Exception:
        logger.exception("job %s: the promotion event could not be written", job.job_id, extra={"job_id": job.job_id})


def _decide_and_record(
    session: Session, job: JobPromotion, number: int, new_loss: float | None, reading: GateReading | None,
    now: AliasTarget | None, data: dict[str, Any],
) -> str:
    """Under the adapter's lock (`now` read with it): decide, move or record (committing), fill the event's
    `data`, and return its message."""
    name = f"{job.adapter}:{job.promotion.alias}"
    if now is not None and now.split is None and now.version == number:
        data.update(decision=UNCHANGED, to_version=number)
        return f"{name} names version {number} already; nothing to promote"
    if job.promotion.when == ALWAYS:
        _move(session, job, number, AliasAction.job_promote, gate=None)
        data.update(decision=PROMOTED, to_version=number)
        return f"Promoted {name} to version {number}" + (f" (from version {now.version})" if now else "")
    skipped = _why_skip(reading, now, new_loss)
    if skipped is not None:
        data.update(decision=SKIPPED, reason=skipped)
        return _skipped_message(job, skipped)
    assert reading is not None and new_loss is not None  # _why_skip
    compared = [{"version": version, "valid_loss": loss} for version, loss in sorted(reading.losses.items())]
    current = min(reading.losses.values()) if reading.losses else None
    gate = {"new_version": number, "new_valid_loss": new_loss, "current_valid_loss": current, "compared": compared}
    data.update(current_valid_loss=current, compared=compared)
    if now is None:
        _move(session, job, number, AliasAction.gated_promote, gate=gate)
        data.update(decision=PROMOTED, to_version=number)
        return f"Created {name} at version {number} (validation loss {new_loss:.4f}); there was nothing to compare with"
    against = f"the lowest of versions {_listed(now.versions)}'s" if now.split else f"version {now.version}'s"
    if new_loss < current:
        _move(session, job, number, AliasAction.gated_promote, gate=gate)
        data.update(decision=PROMOTED, to_version=number)
        return (f"Promoted {name} from version {now.version} to {number}: its validation loss {new_loss:.4f} is below "
                f"{against} {current:.4f}")
    keep_alias(session, tenant_id=job.tenant_id, name=job.adapter, alias=job.promotion.alias,
               actor_key_id=job.actor_key_id, note=JobNote(job.job_id, gate))
    data.update(decision=REFUSED)
    return (f"Kept {name} at version {now.version}: version {number}'s validation loss {new_loss:.4f} is not below "
            f"{against} {current:.4f}")


def _why_skip(reading: GateReading | None, now: AliasTarget | None, new_loss: float | None) -> str | None:
    if reading is None:
        return "the gate measured nothing before the version was published"
    if reading.problem is not None:
        return reading.problem
    if new_loss is None:
        return "the job's version has no validation loss (full_valid_loss) to compare"
    if now != reading.target:
        before = "did not exist" if reading.target is None else f"named {_listed(reading.target.versions)}"
        after = "was deleted" if now is None else f"names {_listed(now.versions)}"
        return f"the alias changed while the gate evaluated (it {before}, now it {after}); compare again yourself"
    return None


def _move(session: Session, job: JobPromotion, number: int, action: AliasAction, gate: dict[str, Any] | None) -> None:
    move_alias(session, tenant_id=job.tenant_id, name=job.adapter, alias=job.promotion.alias, number=number,
               actor_key_id=job.actor_key_id, action=action, note=JobNote(job.job_id, gate))


def _version_files(session: Session, job: JobPromotion, numbers: tuple[int, ...]) -> dict[int, dict[str, str]]:
    """Each version's PEFT files (filename -> sha256)."""
    adapter = find_adapter(session, tenant_id=job.tenant_id, name=job.adapter)
    rows = session.execute(
        select(AdapterVersion.number, AdapterVersionFile.filename, AdapterVersionFile.sha256)
        .join(AdapterVersionFile, AdapterVersionFile.version_id == AdapterVersion.id)
        .where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.number.in_(numbers),
               AdapterVersionFile.filename.in_((ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)))
    )
    files: dict[int, dict[str, str]] = {number: {} for number in numbers}
    for number, filename, sha256 in rows:
        files[number][filename] = sha256
    return files


def _skipped_message(job: JobPromotion, reason: str) -> str:
    return (f"Skipped promoting {job.adapter}:{job.promotion.alias}: {reason}. The job succeeded; point the alias "
            f"yourself with `loraloom adapters alias set {job.adapter} {job.promotion.alias} VERSION` if you want it")


def _listed(versions: tuple[int, ...]) -> str:
    return ", ".join(str(version) for version in versions)


def _shown(error: Exception) -> str:
    """What the job's user is told: database and file system errors carry SQL and server paths, which are
    the operator's (the worker's log has them)."""
    if isinstance(error, SQLAlchemyError):
        return "a database error (the worker's log has the details)"
    if isinstance(error, OSError):
        return "a storage or file system error (the worker's log has the details)"
    return f"{type(error).__name__}: {error}"[:500]
