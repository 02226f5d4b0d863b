"""How every listing command prints its items: a table for people, or with `--json` the API's
items unchanged, for scripts (`loraloom jobs list --json | jq ...`)."""
from __future__ import annotations

import argparse
import json
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# A listing's table column: its header, and how to read its cell from one of the API's items.
Column = tuple[str, Callable[[dict[str, Any]], Any]]


def field_columns(*columns: tuple[str, str]) -> list[Column]:
    """Columns that each show one field of the item as it is: field_columns(("ID", "id"), ...)."""
    return [(header, operator.itemgetter(name)) for header, name in columns]


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """--json on a listing command (print_listing reads it)."""
    parser.add_argument("--json", action="store_true",
                        help="print the items as a JSON array, exactly as the API returns them, instead of a table")


def print_listing(args: argparse.Namespace, items: Iterable[dict[str, Any]], columns: Sequence[Column]) -> None:
    """The items as a table on stdout, or with --json as the API's objects, for scripts (`| jq`)."""
    if args.json:
        print(json.dumps(list(items), indent=2))
        return
    cells = [[header for header, _ in columns]]
    cells += [["-" if value is None else str(value) for value in (cell(item) for _, cell in columns)] for item in items]
    widths = [max(len(row[column]) for row in cells) for column in range(len(columns))]
    for row in cells:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
