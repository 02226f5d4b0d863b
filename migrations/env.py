"""Alembic environment: runs the revisions in versions/ against one connection.

loraloom.platform.db.migrate passes that connection in config.attributes["connection"];
when Alembic is run from the command line, one is opened the same way from
`-x database_url=...` or the LORALOOM_ settings.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from loraloom.platform.db.migrate import migration_connection
from loraloom.platform.db.models import Base
from loraloom.platform.settings import Settings


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("migrations: offline (--sql) mode is not supported; run them against a database")

shared_connection = context.config.attributes.get("connection")
if shared_connection is not None:
    run_migrations(shared_connection)
else:
    database_url = context.get_x_argument(as_dictionary=True).get("database_url") or Settings().database_url
    with migration_connection(database_url) as cli_connection:
        run_migrations(cli_connection)
