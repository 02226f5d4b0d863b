"""Cursor pagination as OpenAI's lists do it: a page of at most `limit` rows after the cursor
(the last row of the previous page), and whether more follow."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, tuple_
from sqlalchemy.orm import Session

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


def fetch_page(session: Session, query: Select, limit: int) -> Page:
    """The first `limit` rows of `query` (already filtered past the cursor and ordered); one more
    row is read to tell whether another page follows."""
    rows = list(session.scalars(query.limit(limit + 1)))
    return Page(items=rows[:limit], has_more=len(rows) > limit)


def newest_first(session: Session, query: Select, model: Any, cursor: Any | None, limit: int) -> Page:
    """Rows of `query` (on `model`, which has created_at and id) after the row `cursor`, newest first.
    The id breaks ties between rows created in the same instant."""
    if cursor is not None:
        query = query.where(tuple_(model.created_at, model.id) < tuple_(cursor.created_at, cursor.id))
    return fetch_page(session, query.order_by(model.created_at.desc(), model.id.desc()), limit)
