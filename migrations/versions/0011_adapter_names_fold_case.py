"""Adapter names are unique regardless of case within a tenant (`support` and `Support` cannot coexist).

A database that already holds two such names cannot take the index: the upgrade then fails naming them,
and one of the two must be renamed or deleted first.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

INDEX = "uq_adapters_tenant_id_folded_name"


def upgrade() -> None:
    clashes = op.get_bind().execute(sa.text(
        "SELECT tenant_id, lower(name) FROM adapters GROUP BY tenant_id, lower(name) HAVING count(*) > 1"
    )).all()
    if clashes:
        raise RuntimeError(f"adapter names that differ only in case, per (tenant id, name): {clashes}; rename or "
                           "delete one of each before upgrading")
    op.create_index(INDEX, "adapters", ["tenant_id", sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="adapters")
