"""What is at a database path before a storage opens it, read without changing anything:
a missing directory, a WAL without its database, an empty or foreign file, the schema
version; and whether an SQLite error says the file is damaged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from veil.server.storage.errors import StorageError

#: how long a connection waits for another process's write transaction (milliseconds)
BUSY_TIMEOUT_MS = 30_000
#: SQLite's primary result codes that say the file is damaged
_DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def path_problem(path: Path, *, create: bool, what: str = "database") -> str | None:
    """Why ``path`` cannot be the file ``what`` names (a database, a backup): its directory
    is missing, or it is a directory. A sentence that says what to do; ``None`` if nothing is
    visibly wrong."""
    if path.is_dir():
        return (f"{path} is a directory; give a file inside it, e.g. "
                f"{path / 'veil.db'}")
    directory = path.parent
    if directory.is_dir() or path.exists():
        return None
    missing = directory
    while not missing.parent.is_dir() and missing.parent != missing:
        missing = missing.parent
    if missing.exists():
        return f"{missing}, on the path of {path}, is not a directory; choose another path"
    if not create:
        return f"no Veil database at {path}: the directory {directory} does not exist"
    return (f"cannot create the {what} {path}: the directory {directory} does not exist; "
            f"create it first (mkdir -p {directory}) or choose another path")


def orphan_wal_problem(path: Path) -> str | None:
    """Why ``path`` must not be opened: a ``-wal`` file with transactions is beside it but the
    database file is missing or empty, as when the file was moved or deleted under a running
    collector. SQLite would delete that WAL on opening, and with it every transaction not yet
    copied into the database: reports the collector acknowledged. A sentence that says what
    to do; ``None`` if there is no such WAL."""
    wal = path.with_name(path.name + "-wal")
    try:
        if wal.stat().st_size == 0 or (path.exists() and path.stat().st_size > 0):
            return None
    except FileNotFoundError:
        return None
    return (f"{wal} holds transactions of a database that is no longer at {path} (moved or "
            f"deleted while a collector had it open); opening {path} would discard them. Move "
            f"the database file back to {path}, or, to start a new database and give up what "
            f"the WAL holds, move {wal} (and {path.name}-shm) aside first "
            "(docs/operations.md, Recovery)")


def read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file at ``path``: nothing in the file changes,
    its journal mode included. :class:`StorageError` if it cannot be opened."""
    try:
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                               timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from None


def read_schema(path: Path) -> tuple[int, int]:
    """``(PRAGMA user_version, number of schema objects)`` of the SQLite file at ``path``,
    read through a :func:`read_only` connection; :class:`StorageError` if it cannot be
    read."""
    conn = read_only(path)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = int(conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0])
    except sqlite3.Error as exc:
        detail = "it is not a usable SQLite database: " if is_damage(exc) else ""
        raise StorageError(f"cannot read the schema of {path}: {detail}{exc}") from None
    finally:
        conn.close()
    return version, tables


def not_veil_problem(path: Path, create: bool = False) -> str | None:
    """Why the existing file at ``path`` must not be opened as a Veil database: it is another
    program's SQLite file, or it is empty and the caller would not ``create`` a database in
    it. Checked before the first connection that may write, so such a file is left exactly as
    it was (its journal mode included). ``None`` if it looks like a Veil database, or cannot
    be read (opening then says why, with the recovery)."""
    try:
        version, tables = read_schema(path)
    except StorageError:
        return None
    if version != 0 or (create and not tables):
        return None
    return not_veil_sentence(path, tables)


def missing_store(path: Path) -> str:
    """What to say of a path where no file is."""
    return f"no Veil database at {path}; start the collector with this --db first"


def not_veil_sentence(path: Path, tables: int) -> str:
    """What to say of a file at schema version 0 holding ``tables`` schema objects."""
    if tables:
        return f"{path} is an SQLite file but not a Veil database"
    return (f"no Veil database at {path}: the file is empty; start the collector with this "
            "--db first")


def is_damage(exc: BaseException) -> bool:
    """Whether SQLite says the file is damaged (rather than busy, full or unreachable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DAMAGE_CODES
