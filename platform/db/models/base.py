"""The declarative base every table derives from, and the column types the tables share.

Any change to a table needs a new Alembic revision in migrations/versions; the test suite fails
while the models and the migrated schema differ.
"""
from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Enum, Integer, MetaData
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator


# Deterministic constraint names, so migrations can address constraints on every backend
# (SQLite's batch mode needs names to drop or alter them). Kept under PostgreSQL's 63 chars.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL keeps the offset; SQLite stores text without one, so values are normalized
    to UTC on the way in and marked UTC on the way out. Naive datetimes are refused
    rather than guessed at.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"datetime {value.isoformat()} has no timezone; pass an aware datetime such as utcnow()")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


# JSONB on PostgreSQL (indexable, e.g. tag containment), plain JSON text elsewhere.
JSONDocument = JSON().with_variant(JSONB(), "postgresql")
# 64-bit ids for append-only tables; SQLite autoincrements only an INTEGER primary key.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")
# The largest integer either database holds (SQLite's INTEGER, PostgreSQL's BIGINT). A larger one
# from a client must be refused where it arrives: SQLite's driver raised OverflowError (a 500).
MAX_INT64 = 2**63 - 1


def enum_column(enum_class: type[enum.Enum], name: str) -> Enum:
    # Stored as VARCHAR holding the enum's values: adding a value later needs no
    # PostgreSQL ALTER TYPE, and the same migration runs on SQLite.
    return Enum(
        enum_class,
        name=name,
        native_enum=False,
        length=16,
        values_callable=lambda members: [member.value for member in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONDocument, list[str]: JSONDocument}
