"""A job's `promote` option: the alias of the job's adapter (`suffix`) that the job moves to its version
when it succeeds, and when: `always`, or `valid_loss_improves`, only if the version's validation loss is
lower than that of what the alias names now (the evaluation gate, promotion_gate.py).

Checked when the job is created (and estimated), so that a job never trains for an hour towards a
promotion that cannot happen: the alias's name, that it is one a user moves (not `latest`), and that a
gate comparing validation losses has a validation file."""
from __future__ import annotations

from dataclasses import dataclass

from loraloom.engine import RequestFieldError
from loraloom.platform.registry.references import LATEST_ALIAS, check_alias_name
from loraloom.platform.training.errors import TrainingInputError

VALID_LOSS_IMPROVES = "valid_loss_improves"
ALWAYS = "always"
PROMOTE_WHEN = (VALID_LOSS_IMPROVES, ALWAYS)
INVALID_PROMOTE = "invalid_promote"


@dataclass(frozen=True)
class Promotion:
    alias: str
    when: str = VALID_LOSS_IMPROVES


def check_promotion(promotion: Promotion | None, validation_file: str | None) -> None:
    """Raise TrainingInputError naming `promote.alias` or `promote.when` when the promotion cannot happen."""
    if promotion is None:
        return
    try:
        check_alias_name(promotion.alias)
    except RequestFieldError as error:
        raise TrainingInputError(code=INVALID_PROMOTE, param="promote.alias",
                                 message=f"promote.alias: {error.problem}") from None
    if promotion.alias == LATEST_ALIAS:
        raise TrainingInputError(
            code=INVALID_PROMOTE, param="promote.alias",
            message=f"promote.alias: {LATEST_ALIAS!r} always names the newest version and moves by itself; promote "
                    "another alias (e.g. prod)",
        )
    if promotion.when not in PROMOTE_WHEN:
        raise TrainingInputError(code=INVALID_PROMOTE, param="promote.when",
                                 message=f"promote.when: {promotion.when!r} is not one of {', '.join(PROMOTE_WHEN)}")
    if promotion.when == VALID_LOSS_IMPROVES and validation_file is None:
        raise TrainingInputError(
            code=INVALID_PROMOTE, param="promote.when",
            message=f"promote.when: {VALID_LOSS_IMPROVES} compares validation losses, and the job has no "
                    f"validation_file; give one, or promote with when {ALWAYS!r}",
        )
