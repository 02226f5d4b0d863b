"""Rate limits and quotas: per tenant (requests and tokens per minute, concurrent requests and
training jobs, a monthly token quota, the fair-share weight) and per API key (the first three).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

PER_MINUTE_AND_CONCURRENT = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests")


def _at_least_one(table: str, column: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(f"{column} >= 1", name=op.f(f"ck_{table}_{column}"))


def _limit_columns() -> list[sa.Column]:
    return [
        sa.Column("requests_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("tokens_per_minute", sa.BigInteger(), nullable=True),
        sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        *_limit_columns(),
        sa.Column("max_training_jobs", sa.Integer(), nullable=True),
        sa.Column("monthly_tokens", sa.BigInteger(), nullable=True),
        sa.Column("share_weight", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        *(_at_least_one("tenant_limits", column)
          for column in (*PER_MINUTE_AND_CONCURRENT, "max_training_jobs", "monthly_tokens")),
        sa.CheckConstraint("share_weight > 0", name=op.f("ck_tenant_limits_share_weight")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_tenant_limits_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenant_limits")),
    )
    op.create_table(
        "api_key_limits",
        sa.Column("api_key_id", sa.Uuid(), nullable=False),
        *_limit_columns(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        *(_at_least_one("api_key_limits", column) for column in PER_MINUTE_AND_CONCURRENT),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name=op.f("fk_api_key_limits_api_key_id_api_keys"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("api_key_id", name=op.f("pk_api_key_limits")),
    )


def downgrade() -> None:
    op.drop_table("api_key_limits")
    op.drop_table("tenant_limits")
