"""The PostgreSQL backend: ``postgresql://`` URLs, for collectors on several hosts sharing one
database (psycopg 3, the ``postgres`` extra)."""

from veil.server.storage.postgres.backend import REPLAY_WINDOW_DAYS, PostgresStorage

__all__ = ["REPLAY_WINDOW_DAYS", "PostgresStorage"]
