"""Replay rejection across processes: which report ids a SQLite file already holds.

Ids are kept in two tables (see :mod:`veil.server.storage.sqlite.schema`):
``recent_ids``, where new ids are appended, and ``report_ids``, the sorted index
they are merged into in bulk once there are ``limit`` of them. Each process
keeps a copy of ``recent_ids`` in memory (:class:`RecentIds`), brought up to
date inside every write transaction, so "seen before?" is one set lookup plus
one index query per group of inserts, exact across worker processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from veil.server.storage.sqlite.rows import DamagedRow

# The ids of a group travel as one concatenated blob that SQLite cuts with substr() in a
# loop of its own: one statement looks them all up, one appends the new ones.
_ID_OFFSETS = (
    "WITH RECURSIVE offsets(i) AS "
    "(SELECT 0 UNION ALL SELECT i + 16 FROM offsets WHERE i + 16 < length(?1)) "
)
_INDEXED_IDS = (
    _ID_OFFSETS + "SELECT report_ids.id FROM offsets "
    "JOIN report_ids ON report_ids.id = substr(?1, offsets.i + 1, 16)"
)
_APPEND_IDS = (
    _ID_OFFSETS
    + "INSERT INTO recent_ids (id) SELECT substr(?1, i + 1, 16) FROM offsets WHERE i < length(?1)"
)
_MERGE_IDS = "INSERT OR IGNORE INTO report_ids (id) SELECT id FROM recent_ids ORDER BY id"


class RecentIds:
    """This process's copy of ``recent_ids``: the ids, the last rowid read, and the
    ``ids_generation`` they belong to (``None``: read the table again).

    Callers hold the store's write lock around every method but :attr:`full`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ids: set[bytes] = set()
        self.rowid = 0
        self.generation: int | None = None

    @property
    def full(self) -> bool:
        """Whether enough ids wait to be merged into the index."""
        return len(self.ids) >= self.limit

    def invalidate(self) -> None:
        """Forget what was read: the next :meth:`sync` reads the table from its generation."""
        self.generation = None

    def sync(self, conn: sqlite3.Connection) -> None:
        """Bring the copy up to date, inside a write transaction.

        Other processes only append to the table between merges, so reading the
        rows after the last one seen is enough; a merge (a new ``ids_generation``)
        empties it, and the copy starts over.
        """
        row = conn.execute("SELECT value FROM meta WHERE key = 'ids_generation'").fetchone()
        try:
            generation = int(row[0])
        except (TypeError, ValueError):
            raise DamagedRow(f"meta holds no ids_generation count (found {row!r})") from None
        if generation != self.generation:
            self.ids = set()
            self.rowid = 0
            self.generation = generation
        # one row (hex of every new id joined) rather than a row per id: each row stepped
        # releases and retakes the GIL, which request threads of this process also want
        last, joined = conn.execute(
            "SELECT max(rowid), group_concat(hex(id), '') FROM recent_ids WHERE rowid > ?",
            (self.rowid,),
        ).fetchone()
        if last is not None:
            new = bytes.fromhex(joined)
            self.ids.update([new[i : i + 16] for i in range(0, len(new), 16)])
            self.rowid = last

    def known(self, conn: sqlite3.Connection, ids: Iterable[bytes], joined: bytes) -> set[bytes]:
        """Which of ``ids`` (``joined``: the same, concatenated) the file already holds;
        call after :meth:`sync` in the same transaction."""
        found = self.ids.intersection(ids)
        found.update(row[0] for row in conn.execute(_INDEXED_IDS, (joined,)))
        return found

    def append(self, conn: sqlite3.Connection, joined: bytes) -> int:
        """Append new ids (concatenated) to ``recent_ids``; return the table's last rowid."""
        if joined:
            conn.execute(_APPEND_IDS, (joined,))
        return int(conn.execute("SELECT coalesce(max(rowid), 0) FROM recent_ids").fetchone()[0])

    def committed(self, ids: Iterable[bytes], last_rowid: int) -> None:
        """Record ids appended by a transaction that has committed."""
        self.ids.update(ids)
        self.rowid = last_rowid

    def merge(self, conn: sqlite3.Connection) -> bool:
        """Move ``recent_ids`` into the ``report_ids`` index, sorted, inside a write
        transaction; return False if another process merged first."""
        self.sync(conn)
        if not self.full:
            return False
        conn.execute(_MERGE_IDS)
        conn.execute("DELETE FROM recent_ids")
        conn.execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) "
                     "WHERE key = 'ids_generation'")
        return True
