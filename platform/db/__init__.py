"""The control plane's database: models, sessions and migrations."""
from loraloom.platform.db.migrate import database_revision, downgrade_database, upgrade_database
from loraloom.platform.db.session import create_db_engine, create_session_factory

__all__ = ["create_db_engine", "create_session_factory", "database_revision", "downgrade_database", "upgrade_database"]
