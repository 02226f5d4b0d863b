"""What every resource's bodies build on: strict request bodies, OpenAI's list and page shapes
and their query parameters, OpenAI's error body, Unix-second times."""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from loraloom.platform.db.pages import Page


def one_error_for_union(expected: str) -> WrapValidator:
    """Report a value that fits no member of a union as one error ("must be ..."),
    instead of one error per member with pydantic's member tags in the field path."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("union_type", "must be {expected}", {"expected": expected}) from None

    return WrapValidator(validate)


def documented_pattern(rule: re.Pattern[str]) -> dict[str, str]:
    """`json_schema_extra` stating in the OpenAPI document what `rule` fully matches, for a name that its
    service checks with that very pattern (and words what is wrong itself): documented once, checked once."""
    return {"pattern": f"^(?:{rule.pattern})$"}


def documented_bounds(**by_type: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """`json_schema_extra` stating bounds that a validator checks (and words itself, naming the field as a
    whole): each JSON type's keywords, e.g. `array={"maxItems": 16}`, go on the schema or the union
    branch of that type; `items` keywords go on the array's items."""
    def add(schema: dict[str, Any]) -> None:
        for branch in schema.get("anyOf", [schema]):
            bounds = dict(by_type.get(branch.get("type"), {}))
            items = bounds.pop("items", None)
            branch.update(bounds)
            if items:
                branch.setdefault("items", {}).update(items)
    return add


def _not_a_number(value: Any) -> Any:
    # pydantic reads a number as Unix seconds; the document promises ISO 8601 (format date-time).
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", value):
        raise ValueError(f"{value!r} is not an ISO 8601 time; write e.g. 2024-05-01T00:00:00Z")
    return value


def _integral_float(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as JSON Schema has it: 3 and 3.0, never `true` or "3", which pydantic's lax int would take.
# With bounds: `Annotated[StrictInt, Field(ge=1), JSON_INTEGER]`, the validator last, or the bounds are
# missing from the document.
JSON_INTEGER = BeforeValidator(_integral_float)
JsonInteger = Annotated[StrictInt, JSON_INTEGER]


# A time in a query string: ISO 8601, as its `format: date-time` says (a bare number is refused).
IsoTime = Annotated[datetime, BeforeValidator(_not_a_number)]


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


T = TypeVar("T")


DEFAULT_PAGE_SIZE = 20


MAX_PAGE_SIZE = 100


# The `limit` query parameter of the paginated lists: `limit: PageLimit = DEFAULT_PAGE_SIZE`.
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]


TenantQuery = Annotated[
    str | None, Query(description="A tenant's name; the operator's keys only. Default: the calling key's tenant.")
]


class ListObject(BaseModel, Generic[T]):
    """OpenAI's list: `{"object": "list", "data": [...]}`. Subclass it with a name
    (`class ModelList(ListObject[ModelCard])`) so the OpenAPI document names the schema."""

    object: Literal["list"] = "list"
    data: list[T]


class PageObject(ListObject[T], Generic[T]):
    """One page of a cursor-paginated list: pass the last item's cursor as `after` for the next."""

    has_more: bool

    @classmethod
    def of(cls: type[PageT], page: Page[Any], convert: Callable[[Any], Any]) -> PageT:
        data = [convert(item) for item in page.items]
        return cls(data=data, has_more=page.has_more, **cls.cursors(data))

    @classmethod
    def cursors(cls, data: list[T]) -> dict[str, Any]:
        """The fields beyond OpenAI's three that name the page's ends."""
        return {}


PageT = TypeVar("PageT", bound=PageObject[Any])


class IdPageObject(PageObject[T], Generic[T]):
    """A page that also names its first and last items' ids, as OpenAI's files and checkpoints lists do."""

    first_id: str | None
    last_id: str | None

    @classmethod
    def cursors(cls, data: list[T]) -> dict[str, Any]:
        return {"first_id": data[0].id if data else None, "last_id": data[-1].id if data else None}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def unix_seconds(moment: datetime | None) -> int | None:
    """OpenAI objects carry times as integer Unix seconds (`created_at`, `finished_at`)."""
    return None if moment is None else int(moment.timestamp())
