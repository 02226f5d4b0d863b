"""Fine-tuning jobs gain what OpenAI's and Together's jobs have: a method (supervised or DPO), metadata,
early stopping, pause and resume, a start from a checkpoint, and an alias to promote on success; and the
training speed measured per base model, which estimates divide by.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

Statuses are stored as text (no database enum type): `pause_requested` and `paused` need no change.
Jobs created before this revision are supervised, without metadata, early stopping, a start checkpoint or
a promotion.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

json_document = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("fine_tuning_jobs") as batch:
        # server_default fills the existing rows; the model's default writes new ones.
        batch.add_column(sa.Column("method", sa.String(length=16), nullable=False, server_default="supervised"))
        batch.add_column(sa.Column("metadata", json_document, nullable=True))
        batch.add_column(sa.Column("early_stopping_patience", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("from_checkpoint", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("promote_alias", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("promote_when", sa.String(length=32), nullable=True))
    with op.batch_alter_table("fine_tuning_jobs") as batch:
        batch.alter_column("method", server_default=None)
    op.create_table(
        "training_throughput",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("tokens_per_second", sa.Double(), nullable=False),
        sa.Column("startup_seconds", sa.Double(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "model", name=op.f("pk_training_throughput")),
    )


def downgrade() -> None:
    op.drop_table("training_throughput")
    # Before this revision there is no pausing: a pause under way becomes a cancel under way, a paused job cancelled.
    op.execute("UPDATE fine_tuning_jobs SET status = 'cancel_requested' WHERE status = 'pause_requested'")
    op.execute("UPDATE fine_tuning_jobs SET status = 'cancelled', finished_at = CURRENT_TIMESTAMP "
               "WHERE status = 'paused'")
    with op.batch_alter_table("fine_tuning_jobs") as batch:
        batch.drop_column("promote_when")
        batch.drop_column("promote_alias")
        batch.drop_column("from_checkpoint")
        batch.drop_column("early_stopping_patience")
        batch.drop_column("metadata")
        batch.drop_column("method")
