"""Usage records name the adapter as its tenant knows it: name, version number, the alias the
request followed. Usage used to be grouped by the engine's runtime key, which now names content
(two versions holding the same bytes share it) and never meant anything to users.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

Rows metered before this revision get their name and version from the runtime key they stored
("<tenant>/<name>@<N>#<digest>", "<tenant>/<checkpoint id>#<digest>", "<name>@<digest>"), and an
alias from the `model` the client sent ("name:alias"; a bare registry name followed `latest`).
"""
from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TENANT_KEY = re.compile(r"[^/]+/(?P<name>[^@#]+)(?:@(?P<version>[0-9]+))?#[0-9a-f]+")
_SERVER_KEY = re.compile(r"(?P<name>[^/@#]+)@[0-9a-f]+")


def _names(adapter_key: str, model: str) -> dict[str, object] | None:
    match = _TENANT_KEY.fullmatch(adapter_key) or _SERVER_KEY.fullmatch(adapter_key)
    if match is None:
        return None
    name = match["name"]
    version = int(match["version"]) if match.groupdict().get("version") else None
    alias = None
    if version is not None:
        if model.startswith(f"{name}:"):
            alias = model[len(name) + 1:]
        elif model == name:
            alias = "latest"
    return {"adapter_name": name[:128], "adapter_version": version, "adapter_alias": alias and alias[:64]}


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("adapter_name", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("adapter_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("adapter_alias", sa.String(length=64), nullable=True))
    records = sa.table(
        "usage_records",
        sa.column("id", sa.BigInteger()),
        sa.column("adapter_key", sa.String()),
        sa.column("model", sa.String()),
        sa.column("adapter_name", sa.String()),
        sa.column("adapter_version", sa.Integer()),
        sa.column("adapter_alias", sa.String()),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(records.c.id, records.c.adapter_key, records.c.model).where(records.c.adapter_key.is_not(None))
    ).all()
    for row_id, adapter_key, model in rows:
        names = _names(adapter_key, model)
        if names is not None:
            connection.execute(sa.update(records).where(records.c.id == row_id).values(**names))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        for column in ("adapter_alias", "adapter_version", "adapter_name"):
            batch.drop_column(column)
