"""Adapter versions record the base model their adapter_config.json declares: a different name is no
longer refused (compatibility is judged by modules and shapes) but shown as a warning.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("adapter_versions", sa.Column("declared_base_model", sa.String(length=1024), nullable=True))


def downgrade() -> None:
    op.drop_column("adapter_versions", "declared_base_model")
