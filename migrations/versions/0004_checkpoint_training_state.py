"""Fine-tuning checkpoints keep the run's training state (optimizer, schedule, RNG), so that a
retried job resumes from its last checkpoint.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

Checkpoints saved before this revision have none: a retry of their job starts over.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fine_tuning_checkpoints") as batch:
        batch.add_column(sa.Column("training_state_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fine_tuning_checkpoints") as batch:
        batch.drop_column("training_state_sha256")
