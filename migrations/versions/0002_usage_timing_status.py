"""Usage records: the runtime adapter key, time to first token, total time and outcome.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Rows metered before this revision get status 'ok' and a duration of 0 (unknown).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("adapter_key", sa.String(length=256), nullable=True))
        batch.add_column(
            sa.Column(
                "status",
                sa.Enum("ok", "error", "aborted", name="usage_status", native_enum=False, length=16),
                nullable=False,
                server_default="ok",
            )
        )
        batch.add_column(sa.Column("time_to_first_token_ms", sa.Double(), nullable=True))
        batch.add_column(sa.Column("duration_ms", sa.Double(), nullable=False, server_default="0"))
    # The defaults only filled the existing rows; new rows always say what happened.
    with op.batch_alter_table("usage_records") as batch:
        batch.alter_column("status", server_default=None)
        batch.alter_column("duration_ms", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        for column in ("duration_ms", "time_to_first_token_ms", "status", "adapter_key"):
            batch.drop_column(column)
