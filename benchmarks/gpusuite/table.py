"""One row per figure, each next to its ceiling; printed as one table and written as JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

COLUMNS = ("scenario", "measured", "unit", "ceiling / target", "fraction")


@dataclass(frozen=True)
class Row:
    scenario: str
    value: float
    unit: str
    # The physical bound in the same unit (measured ceilings and the roofline model), if one applies.
    ceiling: float | None = None
    target: str | None = None  # the target, as text ("<= 25")
    higher_is_better: bool = True
    passed: bool | None = None  # correctness checks only: within tolerance

    @property
    def fraction(self) -> float | None:
        """How close to the ceiling: measured / ceiling, or ceiling / measured for times."""
        if self.ceiling is None or self.value <= 0:
            return None
        return self.value / self.ceiling if self.higher_is_better else self.ceiling / self.value


def number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _cells(row: Row) -> tuple[str, ...]:
    bound = [] if row.ceiling is None else [number(row.ceiling)]
    if row.target is not None:
        bound.append(f"target {row.target}")
    if row.passed is not None:
        fraction = "pass" if row.passed else "FAIL"
    else:
        fraction = "" if row.fraction is None else f"{row.fraction:.2f}"
    return row.scenario, number(row.value), row.unit, " ".join(bound), fraction


def format_table(rows: list[Row]) -> str:
    cells = [COLUMNS] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(path: Path, meta: dict, rows: list[Row]) -> None:
    payload = {"meta": meta, "rows": [asdict(row) | {"fraction": row.fraction} for row in rows]}
    path.write_text(json.dumps(payload, indent=2))
