"""Fine-tuning: uploaded files, jobs, their events and checkpoints.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Frozen like 0001: plain SQLAlchemy types, never the application's models.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

json_document = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements only INTEGER keys
timestamp = sa.DateTime(timezone=True)
JOB_STATUSES = ("validating_files", "queued", "running", "succeeded", "failed", "cancel_requested", "cancelled")


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("line_count", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("max_example_tokens", sa.Integer(), nullable=False),
        sa.Column("created_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_files_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["created_by_key_id"], ["api_keys.id"], name=op.f("fk_files_created_by_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index(op.f("ix_files_sha256"), "files", ["sha256"])
    op.create_index(op.f("ix_files_tenant_id_created_at"), "files", ["tenant_id", "created_at"])
    op.create_table(
        "fine_tuning_jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("created_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("training_file", sa.String(length=40), nullable=False),
        sa.Column("validation_file", sa.String(length=40), nullable=True),
        sa.Column("suffix", sa.String(length=128), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("hyperparameters", json_document, nullable=False),
        sa.Column(
            "status", sa.Enum(*JOB_STATUSES, name="fine_tuning_job_status", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_param", sa.String(length=128), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("run_token", sa.String(length=32), nullable=True),
        sa.Column("worker_id", sa.String(length=255), nullable=True),
        sa.Column("heartbeat_at", timestamp, nullable=True),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=True),
        sa.Column("metrics", json_document, nullable=True),
        sa.Column("result_version_id", sa.Uuid(), nullable=True),
        sa.Column("fine_tuned_model", sa.String(length=256), nullable=True),
        sa.Column("created_at", timestamp, nullable=False),
        sa.Column("started_at", timestamp, nullable=True),
        sa.Column("finished_at", timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_fine_tuning_jobs_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["created_by_key_id"], ["api_keys.id"], name=op.f("fk_fine_tuning_jobs_created_by_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["result_version_id"], ["adapter_versions.id"],
            name=op.f("fk_fine_tuning_jobs_result_version_id_adapter_versions"), ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fine_tuning_jobs")),
    )
    op.create_index(
        op.f("ix_fine_tuning_jobs_tenant_id_created_at"), "fine_tuning_jobs", ["tenant_id", "created_at"]
    )
    op.create_index(op.f("ix_fine_tuning_jobs_status_heartbeat_at"), "fine_tuning_jobs", ["status", "heartbeat_at"])
    op.create_table(
        "fine_tuning_job_events",
        sa.Column("id", big_id, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("level", sa.String(length=8), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", json_document, nullable=True),
        sa.Column("created_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["fine_tuning_jobs.id"], name=op.f("fk_fine_tuning_job_events_job_id_fine_tuning_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fine_tuning_job_events")),
    )
    op.create_index(op.f("ix_fine_tuning_job_events_job_id_id"), "fine_tuning_job_events", ["job_id", "id"])
    op.create_table(
        "fine_tuning_checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", json_document, nullable=False),
        sa.Column("config_sha256", sa.String(length=64), nullable=False),
        sa.Column("weights_sha256", sa.String(length=64), nullable=False),
        sa.Column("weights_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["fine_tuning_jobs.id"], name=op.f("fk_fine_tuning_checkpoints_job_id_fine_tuning_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fine_tuning_checkpoints")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_fine_tuning_checkpoints_job_id_step")),
    )
    op.create_index(
        op.f("ix_fine_tuning_checkpoints_weights_sha256"), "fine_tuning_checkpoints", ["weights_sha256"]
    )


def downgrade() -> None:
    op.drop_table("fine_tuning_checkpoints")
    op.drop_table("fine_tuning_job_events")
    op.drop_table("fine_tuning_jobs")
    op.drop_table("files")
