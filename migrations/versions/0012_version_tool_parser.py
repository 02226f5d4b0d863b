"""Adapter versions record the tool parser their adapter_config.json names (`tool_parser`): chat requests to
the version take that format before one inferred from its chat template or the server's.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("adapter_versions", sa.Column("tool_parser", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("adapter_versions", "tool_parser")
