"""Tenant suspension: when set, every key of the tenant is refused with 403 and its open streams end.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot alter a table in place.
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("suspended_at")
