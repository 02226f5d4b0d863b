"""Initial schema: tenants, API keys, adapters and their versions, files and aliases,
alias history, usage records and the audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Frozen on purpose: this file uses plain SQLAlchemy types, never the application's models,
so it keeps producing the same schema however the models evolve later.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

json_document = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements only INTEGER keys
timestamp = sa.DateTime(timezone=True)


def enum_column(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, length=16)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("role", enum_column("api_key_role", "admin", "developer", "inference"), nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.Column("expires_at", timestamp, nullable=True),
        sa.Column("revoked_at", timestamp, nullable=True),
        sa.Column("last_used_at", timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])
    op.create_table(
        "adapters",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("tags", json_document, nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.Column("updated_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapters_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_adapters_tenant_id_name")),
    )
    op.create_table(
        "adapter_versions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("adapter_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", enum_column("adapter_version_status", "pending", "ready", "failed"), nullable=False),
        sa.Column("status_detail", sa.Text(), nullable=True),
        sa.Column("base_model", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Double(), nullable=False),
        sa.Column("target_modules", json_document, nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("source", enum_column("adapter_version_source", "upload", "training"), nullable=False),
        sa.Column("training_job_id", sa.String(length=64), nullable=True),
        sa.Column("created_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", timestamp, nullable=False),
        sa.CheckConstraint("number >= 1", name=op.f("ck_adapter_versions_number_positive")),
        sa.CheckConstraint("rank >= 1", name=op.f("ck_adapter_versions_rank_positive")),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_adapter_versions_adapter_id_adapters"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["created_by_key_id"],
            ["api_keys.id"],
            name=op.f("fk_adapter_versions_created_by_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_versions")),
        sa.UniqueConstraint("adapter_id", "id", name=op.f("uq_adapter_versions_adapter_id_id")),
        sa.UniqueConstraint("adapter_id", "number", name=op.f("uq_adapter_versions_adapter_id_number")),
    )
    op.create_table(
        "adapter_version_files",
        sa.Column("id", big_id, nullable=False),
        sa.Column("version_id", sa.Uuid(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["adapter_versions.id"],
            name=op.f("fk_adapter_version_files_version_id_adapter_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapter_version_files")),
        sa.UniqueConstraint("version_id", "filename", name=op.f("uq_adapter_version_files_version_id_filename")),
    )
    op.create_index(op.f("ix_adapter_version_files_sha256"), "adapter_version_files", ["sha256"])
    op.create_table(
        "aliases",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("adapter_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.Uuid(), nullable=False),
        sa.Column("updated_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("updated_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id", "version_id"],
            ["adapter_versions.adapter_id", "adapter_versions.id"],
            name=op.f("fk_aliases_adapter_id_version_id_adapter_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_aliases_adapter_id_adapters"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["updated_by_key_id"],
            ["api_keys.id"],
            name=op.f("fk_aliases_updated_by_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_aliases")),
        sa.UniqueConstraint("adapter_id", "name", name=op.f("uq_aliases_adapter_id_name")),
    )
    op.create_table(
        "alias_history",
        sa.Column("id", big_id, nullable=False),
        sa.Column("adapter_id", sa.Uuid(), nullable=False),
        sa.Column("alias_name", sa.String(length=64), nullable=False),
        sa.Column("from_version_id", sa.Uuid(), nullable=True),
        sa.Column("to_version_id", sa.Uuid(), nullable=True),
        sa.Column("changed_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("changed_at", timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_alias_history_adapter_id_adapters"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["changed_by_key_id"],
            ["api_keys.id"],
            name=op.f("fk_alias_history_changed_by_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["from_version_id"], ["adapter_versions.id"], name=op.f("fk_alias_history_from_version_id_adapter_versions")
        ),
        sa.ForeignKeyConstraint(
            ["to_version_id"], ["adapter_versions.id"], name=op.f("fk_alias_history_to_version_id_adapter_versions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alias_history")),
    )
    op.create_index(
        op.f("ix_alias_history_adapter_id_alias_name_id"), "alias_history", ["adapter_id", "alias_name", "id"]
    )
    op.create_table(
        "usage_records",
        sa.Column("id", big_id, nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("adapter_version_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index(op.f("ix_usage_records_tenant_id_created_at"), "usage_records", ["tenant_id", "created_at"])
    op.create_table(
        "audit_log",
        sa.Column("id", big_id, nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("actor_key_id", sa.Uuid(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("resource_type", sa.String(length=32), nullable=False),
        sa.Column("resource_id", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("client_ip", sa.String(length=45), nullable=True),
        sa.Column("details", json_document, nullable=False),
        sa.Column("created_at", timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_tenant_id_created_at"), "audit_log", ["tenant_id", "created_at"])


def downgrade() -> None:
    # Indexes go with their tables.
    for table in [
        "audit_log",
        "usage_records",
        "alias_history",
        "aliases",
        "adapter_version_files",
        "adapter_versions",
        "adapters",
        "api_keys",
        "tenants",
    ]:
        op.drop_table(table)
