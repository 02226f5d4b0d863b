"""Aliases may split traffic between versions by weight (canary rollouts): alias_splits holds each
split's versions and weights, and alias_history records what each change did (`action`), the split
it set, and for a fine-tuning job's promotion the job and its evaluation gate's comparison.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
ALIAS_ACTIONS = ("set", "split", "promote", "rollback", "delete", "job_promote", "gated_promote", "gate_refused")


def upgrade() -> None:
    op.create_table(
        "alias_splits",
        sa.Column("alias_id", sa.Uuid(), nullable=False),
        sa.Column("version_id", sa.Uuid(), nullable=False),
        sa.Column("adapter_id", sa.Uuid(), nullable=False),
        sa.Column("version_number", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.CheckConstraint("weight >= 1", name=op.f("ck_alias_splits_weight_positive")),
        sa.ForeignKeyConstraint(["alias_id"], ["aliases.id"], name=op.f("fk_alias_splits_alias_id_aliases"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["adapter_id", "version_id"], ["adapter_versions.adapter_id", "adapter_versions.id"],
                                name=op.f("fk_alias_splits_adapter_id_version_id_adapter_versions")),
        sa.PrimaryKeyConstraint("alias_id", "version_id", name=op.f("pk_alias_splits")),
    )
    with op.batch_alter_table("alias_history") as batch:
        batch.add_column(sa.Column("action", sa.Enum(*ALIAS_ACTIONS, name="alias_action", native_enum=False,
                                                     length=16), server_default="set", nullable=False))
        batch.add_column(sa.Column("split", JSON_DOCUMENT, nullable=True))
        batch.add_column(sa.Column("training_job_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("gate", JSON_DOCUMENT, nullable=True))
    # Before this revision a change either pointed the alias at a version or deleted it. The default only
    # filled the existing rows; new rows always say what they did.
    op.execute("UPDATE alias_history SET action = 'delete' WHERE to_version_id IS NULL")
    with op.batch_alter_table("alias_history") as batch:
        batch.alter_column("action", server_default=None)


def downgrade() -> None:
    # Before this revision a change only pointed the alias at a version or deleted it: a refused promotion,
    # which moved nothing, has no such meaning and goes; the other new actions become plain moves.
    op.execute("DELETE FROM alias_history WHERE action = 'gate_refused'")
    with op.batch_alter_table("alias_history") as batch:
        batch.drop_column("gate")
        batch.drop_column("training_job_id")
        batch.drop_column("split")
        batch.drop_column("action")
    op.drop_table("alias_splits")
