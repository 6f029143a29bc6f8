"""The PostgreSQL backend: ``postgresql://`` URLs, for collectors on several hosts sharing one
database (psycopg 3, the ``postgres`` extra)."""

from veil.server.storage.postgres.backend import PostgresStorage
from veil.server.storage.postgres.database import REPLAY_WINDOW_DAYS

__all__ = ["REPLAY_WINDOW_DAYS", "PostgresStorage"]
