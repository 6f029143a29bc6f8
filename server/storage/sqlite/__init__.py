"""The SQLite backend: one file per collector, WAL, group commit, exact replay rejection."""

from veil.server.storage.sqlite.backend import SQLiteStorage
from veil.server.storage.sqlite.files import MIN_FREE_BYTES
from veil.server.storage.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from veil.server.storage.sqlite.writes import RECENT_IDS_LIMIT

__all__ = ["MIGRATIONS", "MIN_FREE_BYTES", "RECENT_IDS_LIMIT", "SCHEMA_VERSION", "SQLiteStorage"]
