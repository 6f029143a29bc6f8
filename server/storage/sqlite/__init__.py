"""The SQLite backend: one file per collector, WAL, group commit, exact replay rejection."""

from veil.server.storage.sqlite.backend import MIN_FREE_BYTES, RECENT_IDS_LIMIT, SQLiteStorage
from veil.server.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = ["MIGRATIONS", "MIN_FREE_BYTES", "RECENT_IDS_LIMIT", "SCHEMA_VERSION", "SQLiteStorage"]
