"""Blob claims: a blob being stored for an operation that has not committed yet (an upload, a
training file, a checkpoint) counts as referenced, and collection and claims lock one row per blob.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blob_locks",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_blob_locks")),
    )
    op.create_table(
        "blob_claims",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_blob_claims")),
    )
    op.create_index(op.f("ix_blob_claims_sha256"), "blob_claims", ["sha256"])


def downgrade() -> None:
    op.drop_index(op.f("ix_blob_claims_sha256"), table_name="blob_claims")
    op.drop_table("blob_claims")
    op.drop_table("blob_locks")
