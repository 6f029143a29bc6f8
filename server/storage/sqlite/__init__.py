"""The SQLite backend: one file per collector, WAL, group commit, exact replay rejection."""

from veil.server.storage.sqlite.backend import RECENT_IDS_LIMIT, SQLiteStorage
from veil.server.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["MIGRATIONS", "RECENT_IDS_LIMIT", "SCHEMA_VERSION", "SQLiteStorage"]
