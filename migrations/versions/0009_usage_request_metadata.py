"""Usage records keep the request's OpenAI `metadata` (at most 16 string pairs), which chat completions
now accept instead of refusing.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

json_document = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("usage_records", sa.Column("request_metadata", json_document, nullable=True))


def downgrade() -> None:
    op.drop_column("usage_records", "request_metadata")
