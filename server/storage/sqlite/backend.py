"""Reports and aggregates in one SQLite file: the default storage backend.

Durability: WAL journal with ``synchronous=FULL``, so every commit is fsynced to
the WAL before :meth:`SQLiteStorage.insert` returns; the HTTP layer answers 2xx
only after that. Writes from many threads go through one writer connection
guarded by a lock; across processes (several ``veil serve`` workers, or
``veil rebuild-aggregates`` beside a running server) writers take an exclusive
``flock`` on ``<db>.lock`` and then ``BEGIN IMMEDIATE`` (with a busy timeout),
so they queue instead of failing. Inserts that queue behind the lock are
committed together (:mod:`~veil.server.storage.sqlite.commit`); replayed ids are
recognized by :mod:`~veil.server.storage.sqlite.ids`. Any SQLite failure at run
time raises :class:`~veil.server.storage.base.StorageUnavailable`.

Damage: opening runs ``PRAGMA quick_check`` and refuses a damaged file with a
:class:`~veil.server.storage.base.StorageError` that names the recovery; a damaged
page met later fails that call (``StorageUnavailable``) and every readiness
probe after it; a row SQLite reads but Veil never writes fails the calls that
read it. :meth:`SQLiteStorage.check` (``veil check``) examines a file whole.

The file under a running collector: every write transaction first checks that
:attr:`~SQLiteStorage.path` still names the open file and that the file has not
shrunk (:meth:`SQLiteStorage._open_file_problem`), and refuses with
``StorageUnavailable`` otherwise: a moved or deleted file's acknowledged writes
would land in a ``-wal`` beside the old name that the next opener discards, and a
truncated one is damaged. Reads are not memory-mapped: a page mapped past the
end of a file truncated under the collector kills the process with ``SIGBUS``,
where a read answers SQLite's error. Opening refuses a ``-wal`` with no database
file beside it (:func:`orphan_wal_problem`), which SQLite would delete.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: processes serialize on SQLite's busy timeout alone
    fcntl = None  # type: ignore[assignment]

from veil.server.storage.base import (
    LAST_DAY,
    CheckResult,
    DailyCap,
    DailyCapReached,
    DayCount,
    InsertResult,
    Migration,
    SchemaOutdatedError,
    Storage,
    StorageError,
    StorageUnavailable,
    StoredReports,
    parse_day,
    payload_array,
    registry_to_record,
    seconds_left_in_day,
    today,
)
from veil.server.storage.sqlite import rows as sql
from veil.server.storage.sqlite.commit import GroupCommit, Pending, Statement
from veil.server.storage.sqlite.ids import RecentIds
from veil.server.storage.sqlite.schema import (
    CREATE,
    MIGRATIONS,
    RECOUNT,
    SCHEMA_VERSION,
    migration_steps,
)
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import State, Statistic, statistic_for
from veil.shared.wire import Report

#: how long a write waits for another process's write transaction (milliseconds)
BUSY_TIMEOUT_MS = 30_000
#: page size of new files (bytes): random report ids spread the ids merged into the index over
#: many leaf pages, and each page a transaction changes goes to the WAL whole, so small pages
#: write fewer bytes (figures in docs/operations.md)
PAGE_SIZE = 1024
#: page cache per connection (KiB): random 16-byte ids touch pages all over the id B-tree
CACHE_KIB = 64 * 1024
#: WAL pages before an automatic checkpoint (~40 MiB): merges into the id index dirty many
#: pages, and checkpointing less often writes each hot page to the database file fewer times
WAL_CHECKPOINT_PAGES = (40 << 20) // PAGE_SIZE
#: ids appended to ``recent_ids`` before they are merged into ``report_ids``. Each worker
#: process keeps a copy of them in memory (about 100 bytes an id, 13 MiB at this limit); a
#: larger limit merges less often (fewer index pages written per id) in longer pauses
RECENT_IDS_LIMIT = 131_072
#: files up to this size are checked whole when opened (``PRAGMA quick_check``: about 0.2 s per
#: million reports, 90 MB, measured in docs/operations.md); larger ones check only
#: :data:`OPEN_CHECKED_TABLES` at open, and ``veil check`` examines them whole
QUICK_CHECK_MAX_BYTES = 1 << 30
#: the small tables every request reads, checked at open whatever the file's size
OPEN_CHECKED_TABLES = ("meta", "aggregates", "recent_ids")
#: readiness: the free space the file's filesystem must have for writes to be expected to
#: succeed (room for the WAL to grow to its checkpoint size, about 40 MiB, and a margin)
MIN_FREE_BYTES = 64 << 20
#: readiness: how long the probe waits to begin a write transaction (milliseconds); a writer
#: holding the lock longer is writing, and writes queue behind it, so the probe passes
PING_BUSY_TIMEOUT_MS = 100
#: problems of the integrity check that ``veil check`` lists at most
CHECK_MAX_PROBLEMS = 20
#: SQLite's primary result codes that say the file is damaged
_DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)

logger = logging.getLogger("veil.server.storage")


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


def _is_damage(exc: BaseException) -> bool:
    """Whether SQLite says the file is damaged (rather than busy, full or unreachable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DAMAGE_CODES


class SQLiteStorage(Storage):
    """Reports and aggregates in one SQLite file (WAL, ``synchronous=FULL``).

    Thread-safe: writes are serialized on one connection under a lock, reads use
    pooled connections (WAL readers never block the writer). :attr:`commits` is
    the group commit's lock and queue.
    """

    current_schema = SCHEMA_VERSION

    def __init__(self, path: str | Path, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, recent_ids_limit: int = RECENT_IDS_LIMIT,
                 min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self.path = Path(path)
        problem = path_problem(self.path, create=create) or orphan_wal_problem(self.path)
        if problem is not None:
            raise StorageError(problem)
        if not create and not self.path.exists():
            raise StorageError(
                f"no Veil database at {self.path}; start the collector with this --db first"
            )
        if create:
            # a new file is private whatever the umask: it holds everyone's reports (SQLite
            # gives the -wal and -shm files the database file's mode)
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot create the database {self.path}: {exc.strerror}") from None
        if isinstance(recent_ids_limit, bool) or not isinstance(recent_ids_limit, int) \
                or recent_ids_limit < 1:
            raise StorageError(f"recent_ids_limit must be a positive integer; got {recent_ids_limit!r}")
        if isinstance(min_free_bytes, bool) or not isinstance(min_free_bytes, int) \
                or min_free_bytes < 0:
            raise StorageError(f"min_free_bytes must be an integer >= 0; got {min_free_bytes!r}")
        #: readiness fails while the file's filesystem has less free space than this
        self.min_free_bytes = min_free_bytes
        self.commits = GroupCommit()
        self._recent = RecentIds(recent_ids_limit)
        self._idle_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._damage: str | None = None
        self._file_fd: int | None = None
        self._use_registry(Registry([], version=1))
        self._writer = self._connect()
        self._lock_fd = self._open_lock_file()
        try:
            self._hold_file()
            with self._opening():
                self._verify()
                self.migrated = self._migrate(migrate)
                self._attach(registry)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, url: str, registry: Registry | None = None, *, create: bool = False,
             migrate: bool = False, **options: Any) -> SQLiteStorage:
        """Open ``sqlite:///path`` (relative, or absolute with a fourth slash, as SQLAlchemy
        writes them) or a plain path; the options are ``recent_ids_limit`` and
        ``min_free_bytes``."""
        return cls(cls._path_of(url), registry, create=create, migrate=migrate, **options)

    @classmethod
    def _existing_file(cls, url: str) -> Path:
        """The path of ``url``; :class:`StorageError` naming the problem if no file is there."""
        path = Path(cls._path_of(url))
        problem = path_problem(path, create=False)
        if problem is not None:
            raise StorageError(problem)
        if not path.is_file():
            raise StorageError(f"no Veil database at {path}")
        return path

    @classmethod
    def pending_migrations(cls, url: str) -> list[Migration]:
        """The steps from the file's ``PRAGMA user_version`` to :data:`SCHEMA_VERSION`, read
        without writing (the file is opened read-only)."""
        path = cls._existing_file(url)
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {path}: {exc}") from None
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = int(conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0])
        except sqlite3.Error as exc:
            detail = "it is not a usable SQLite database: " if _is_damage(exc) else ""
            raise StorageError(f"cannot read the schema of {path}: {detail}{exc}") from None
        finally:
            conn.close()
        return cls._steps(path, version, tables)

    @staticmethod
    def _steps(path: Path, version: int, tables: int) -> list[Migration]:
        """The migrations of a file at ``version`` holding ``tables`` tables; a new file (no
        tables) needs none, being created at the current version."""
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"{path} has schema version {version}, newer than this Veil "
                f"({SCHEMA_VERSION}); upgrade Veil to open it"
            )
        if version == 0:
            if tables:
                raise StorageError(f"{path} is an SQLite file but not a Veil database")
            return []
        return migration_steps(version)

    @staticmethod
    def _path_of(url: str) -> str:
        """The file a ``sqlite:///`` URL or a plain path names."""
        path = url.removeprefix("sqlite:///") if "://" in url else url
        if not path or "://" in path:
            raise StorageError(f"{url!r} names no file; write sqlite:///veil.db or a plain path")
        return path

    @property
    def location(self) -> str:
        return str(self.path)

    # -- connections -------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """A configured connection; :class:`StorageUnavailable` if the file cannot be used."""
        try:
            # mode=rw: never create the file. A connection opened once the file was moved or
            # deleted would otherwise make an empty one at the path, and opening an empty
            # database deletes the -wal beside it, which holds the moved file's transactions
            conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None,
                check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000,
            )
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open the database {self.path}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() == "wal":
                conn.execute("PRAGMA synchronous = FULL")
                conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
                conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
                conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            if _is_damage(exc):
                raise StorageUnavailable(self._damaged(
                    f"it is not a usable SQLite database: {exc}")) from None
            raise StorageUnavailable(f"cannot open the database {self.path}: {exc}") from None
        if mode.lower() != "wal":
            conn.close()
            raise StorageError(f"{self.path}: cannot switch to WAL journal mode (got {mode!r})")
        conn.create_function("add_counts", 2, sql.add_counts, deterministic=True)
        return conn

    def _open_lock_file(self) -> int | None:
        """The file whose exclusive ``flock`` serializes writers of all processes.

        Waiting on a lock wakes a writer as soon as the previous one commits,
        where SQLite's busy handler would poll with growing sleeps.
        """
        if fcntl is None:
            return None
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            return os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            self._writer.close()
            raise StorageError(f"cannot open the write lock file {lock_path}: {exc.strerror}") from None

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A read connection from a small pool (as many as concurrent readers, reused)."""
        with self._readers_lock:
            if self._closed:
                raise StorageUnavailable("the storage is closed")
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        finally:
            with self._readers_lock:
                if self._closed or conn.in_transaction:
                    conn.close()
                else:
                    self._idle_readers.append(conn)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: lock, ``BEGIN IMMEDIATE``, commit or roll back."""
        with self.commits.lock, self._transaction() as conn:
            yield conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """:meth:`_write` for a caller that already holds the write lock."""
        if self._closed:
            raise StorageUnavailable("the storage is closed")
        conn = self._writer
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise StorageUnavailable(f"cannot lock {self.path} for writing: "
                                         f"{exc.strerror}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                problem = self._open_file_problem()
                if problem is not None:
                    raise StorageUnavailable(problem)
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self.commits.lock:
            if self._closed:
                return
            self._rescue_unlinked()
            self._closed = True
            self._writer.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
        with self._readers_lock:
            for conn in self._idle_readers:
                conn.close()
            self._idle_readers.clear()
        if self._file_fd is not None:  # after the connections: see _hold_file
            os.close(self._file_fd)

    def ping(self) -> None:
        """Readiness: the file answers a query, is still the one at :attr:`path`, a write
        transaction can begin (``BEGIN IMMEDIATE``, rolled back) and its filesystem has
        :attr:`min_free_bytes` free. Once a call has met a damaged page, never again."""
        if self._damage is not None:
            raise StorageUnavailable(self._damage)
        problem = self._filesystem_problem()
        if problem is not None:
            raise StorageUnavailable(problem)
        with self._unavailable(f"begin a write transaction on {self.path}"), \
                self._reader() as conn:
            conn.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
            conn.execute(f"PRAGMA busy_timeout = {PING_BUSY_TIMEOUT_MS}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                # another writer holds the lock: it is writing, and writes queue behind it
            else:
                conn.execute("ROLLBACK")
            finally:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    def _hold_file(self) -> None:
        """Open a descriptor of the database file, so that ``os.fstat`` tells what became of
        the file SQLite has open (:meth:`_open_file_problem`). It stays open until
        :meth:`close` closes it after every connection: closing a descriptor of a file drops
        the POSIX locks this process holds on it, SQLite's included."""
        try:
            self._file_fd = os.open(self.path, os.O_RDONLY)
            #: the largest size the open file has had: Veil never shrinks it
            self._largest = os.fstat(self._file_fd).st_size
        except OSError as exc:
            raise StorageUnavailable(f"cannot open the database {self.path}: {exc.strerror}") \
                from None

    def _open_file_problem(self) -> str | None:
        """Why writes to the open file would be lost, from ``os.stat`` of :attr:`path` and
        ``os.fstat`` of the open file (two system calls, made before each write transaction
        commits): the path names another file or none, so that the next collector to open it
        would not see those writes (SQLite's ``-wal`` stays beside the old name, and the
        next opener of a missing or empty file discards it); or the file is smaller than it
        has been, truncated or overwritten in place (``cp backup.db veil.db``), which makes it
        damaged (:meth:`_damaged`). ``None`` if neither."""
        if self._file_fd is None or self._closed:
            return "the storage is closed"
        try:
            held = os.fstat(self._file_fd)
            named: os.stat_result | None = self.path.stat()
        except FileNotFoundError:
            named = None
        except OSError as exc:
            return f"cannot examine {self.path}: {exc.strerror}"
        if held.st_size < self._largest:
            return self._damaged(
                f"it shrank from {self._largest:,} to {held.st_size:,} bytes while open: it was "
                "truncated, or overwritten in place as 'cp backup.db veil.db' over a live file "
                "does")
        self._largest = held.st_size
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return None
        if held.st_nlink == 0:
            return (f"{self.path} was moved, deleted or replaced while open: the open file has "
                    "no name left, and nothing is written to it. Stop the collector: it then "
                    f"copies the open file to {self._rescue_path()} (docs/operations.md, "
                    "Recovery)")
        return (f"{self.path} was moved, deleted or replaced while open: the open file is now "
                f"under another name, and nothing is written to it until it is back. Move it "
                f"back to {self.path} (its -wal and -shm stay at the old name: keep them "
                "there), and writes resume (docs/operations.md, Recovery)")

    def _rescue_path(self) -> Path:
        """Where :meth:`_rescue_unlinked` copies the open file: beside :attr:`path`, named by
        the open file's inode, so that every process of one collector names the same copy."""
        assert self._file_fd is not None
        return self.path.with_name(f"{self.path.name}.rescued-{os.fstat(self._file_fd).st_ino}")

    def _rescue_unlinked(self) -> None:
        """Before the connections close: if the open file has no name left (deleted, or
        replaced at :attr:`path`), copy it whole, with what its WAL holds, to
        :meth:`_rescue_path` and log where. Once closed, such a file is gone, and its WAL
        (which SQLite leaves beside the old name of a moved file) is of no use without it.
        Another process of the collector may have made the copy already; then this one
        logs that."""
        if self._file_fd is None:
            return
        try:
            if os.fstat(self._file_fd).st_nlink > 0:
                return
            target = self._rescue_path()
            if target.exists():
                logger.warning("%s was deleted or replaced while open; its copy is %s",
                               self.path, target)
                return
            # the writer: a new connection would open whatever is at the path now
            self._vacuum_into(target, contextlib.nullcontext(self._writer))
        except (OSError, StorageError) as exc:
            logger.error("%s was deleted or replaced while open, and copying it before closing "
                         "failed: %s", self.path, exc)
            return
        logger.warning("%s was deleted or replaced while open; copied what it held to %s. To "
                       "serve it, move %s-wal and %s-shm aside (they belong to the deleted file, "
                       "and the copy holds what they held), then move the copy to %s "
                       "(docs/operations.md, Recovery)",
                       self.path, target, self.path, self.path, self.path)

    def _filesystem_problem(self) -> str | None:
        """Why writes would fail or be lost, as far as the filesystem tells; ``None`` if none."""
        directory = self.path.parent
        problem = self._open_file_problem()
        if problem is not None:
            return problem
        try:
            free = shutil.disk_usage(directory).free
            read_only = hasattr(os, "statvfs") and bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
        except OSError as exc:
            return f"cannot examine the filesystem of {self.path}: {exc.strerror}"
        if read_only:
            return f"the filesystem of {self.path} is read-only"
        if free < self.min_free_bytes:
            return (f"only {free:,} bytes are free on the filesystem of {self.path}, below the "
                    f"{self.min_free_bytes:,} that writes need; free some space")
        return None

    # -- failures ------------------------------------------------------------------

    def _damaged(self, detail: str) -> str:
        """Remember that the file is damaged (readiness fails from now on); say so, with the
        recovery."""
        self._damage = (
            f"{self.path} is damaged ({' '.join(detail.split())}). Stop every collector using "
            f"it, run 'veil check --db {self.path}' and restore the file from a backup "
            "(docs/operations.md, Recovery)"
        )
        return self._damage

    def _explain(self, exc: BaseException) -> str:
        """What ``exc`` means, with the recovery if the file is damaged or holds a row that
        Veil never writes (that one may need only the aggregates rebuilt)."""
        if isinstance(exc, sql.DamagedRow):
            return (f"{self.path} holds a row Veil never writes ({exc}); run 'veil check --db "
                    f"{self.path}' to learn whether rebuilding the aggregates repairs it "
                    "(docs/operations.md, Recovery)")
        return self._damaged(str(exc)) if _is_damage(exc) else str(exc)

    def _failure(self, action: str, exc: BaseException) -> StorageUnavailable:
        """:class:`StorageUnavailable` for a failed ``action`` (see :meth:`_explain`)."""
        return StorageUnavailable(f"cannot {action}: {self._explain(exc)}")

    @contextlib.contextmanager
    def _unavailable(self, action: str) -> Iterator[None]:
        """Turn SQLite's run-time failures, and rows Veil never writes, into
        :class:`StorageUnavailable`."""
        try:
            yield
        except (sqlite3.Error, sql.DamagedRow) as exc:
            raise self._failure(action, exc) from exc

    @contextlib.contextmanager
    def _opening(self) -> Iterator[None]:
        """While opening: a damaged file raises :class:`StorageError` naming the recovery,
        other SQLite failures (locked, read-only, full) :class:`StorageUnavailable`."""
        try:
            yield
        except (sqlite3.Error, sql.DamagedRow) as exc:
            if isinstance(exc, sql.DamagedRow) or _is_damage(exc):
                raise StorageError(self._explain(exc)) from None
            raise StorageUnavailable(f"cannot open {self.path}: {exc}") from None

    def _verify(self) -> None:
        """Refuse a damaged file: ``PRAGMA quick_check`` of the whole file, or only of
        :data:`OPEN_CHECKED_TABLES` for files above :data:`QUICK_CHECK_MAX_BYTES`."""
        if self.path.stat().st_size <= QUICK_CHECK_MAX_BYTES:
            pragmas = ["PRAGMA quick_check"]
        else:
            tables = {row[0] for row in self._writer.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table'")}
            pragmas = [f"PRAGMA quick_check({name})" for name in OPEN_CHECKED_TABLES
                       if name in tables]
        for pragma in pragmas:
            problems = [row[0] for row in self._writer.execute(pragma)]
            if problems != ["ok"]:
                more = f"; {len(problems) - 1} more" if len(problems) > 1 else ""
                raise StorageError(self._damaged(f"{problems[0]}{more}"))

    # -- schema and registry -------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The file's ``PRAGMA user_version``."""
        with self._unavailable(f"read the schema version of {self.path}"):
            return int(self._writer.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, allowed: bool) -> tuple[Migration, ...]:
        """Create the tables of a new file, or bring an older one to :data:`SCHEMA_VERSION`
        (only if ``allowed``, else :class:`SchemaOutdatedError`) in one transaction, each
        step logged; return the steps applied."""
        with self._write() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = int(conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0])
            steps = self._steps(self.path, version, tables)
            if version == 0:
                for statement in CREATE:
                    conn.execute(statement)
            elif steps and not allowed:
                raise SchemaOutdatedError(str(self.path), version, SCHEMA_VERSION)
            for step in steps:
                logger.info("migrating %s: %s", self.path, step)
                began = time.monotonic()
                MIGRATIONS[step.version](self, conn)
                logger.info("migrated %s to schema %d in %.1f s", self.path, step.version + 1,
                            time.monotonic() - began)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return tuple(steps)

    @staticmethod
    def _stored_registry(conn: sqlite3.Connection) -> Registry | None:
        """The registry recorded in ``meta`` (``None`` if none); :class:`~.rows.DamagedRow` if
        it is not what Veil writes."""
        row = conn.execute("SELECT CAST(value AS BLOB) FROM meta WHERE key = 'registry'").fetchone()
        if row is None:
            return None
        try:
            return Registry.from_dict(json.loads(bytes(row[0]).decode("utf-8")))
        except (TypeError, ValueError) as exc:
            raise sql.DamagedRow(f"the registry stored in meta cannot be read ({exc})") from None

    def adopt_stored_registry(self, conn: sqlite3.Connection) -> None:
        """Use the registry stored in the file (for migrations that read reports)."""
        stored = self._stored_registry(conn)
        if stored is None:
            raise StorageError(f"{self.path}: cannot migrate a file without a stored registry")
        self._use_registry(stored)

    def _attach(self, registry: Registry | None) -> Registry:
        """Record ``registry`` in the file (:func:`~veil.server.storage.base.merge_registry`)."""
        with self._write() as conn:
            merged = registry_to_record(
                self._stored_registry(conn), registry,
                lambda: {row[0] for row in conn.execute("SELECT DISTINCT metric FROM aggregates")},
                str(self.path))
            if registry is not None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('registry', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (json.dumps(merged.to_dict(), sort_keys=True),),
                )
            self._use_registry(merged)
            return merged

    # -- writes ------------------------------------------------------------------

    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None, *,
               cap: DailyCap | None = None) -> InsertResult:
        """Store validated reports under ``day`` (default: today, UTC) and update aggregates.

        Reports whose id is already stored, or repeats an earlier report of the
        same call, are duplicates: acknowledged, not counted again. Returns after
        the transaction is committed (fsynced). With a ``cap``, the new reports are
        counted under it in that transaction, or the call alone is refused
        (:class:`~veil.server.storage.base.DailyCapReached`, nothing stored).
        """
        day_text = parse_day(day, "day") or today()
        rows: list[tuple[bytes, str, str, int, Any]] = []
        metrics: dict[str, tuple[Metric, Statistic]] = {}
        for report in reports:
            known = metrics.get(report.metric)
            if known is None:
                known = metrics[report.metric] = self._metric(report.metric)
            metric, statistic = known
            payload = statistic.stored_payload(metric.params, report.payload, report.value)
            rows.append((bytes.fromhex(report.id), report.metric, day_text, report.cohort, payload))
        if not rows:
            return InsertResult(0, 0)
        first: dict[bytes, tuple[Any, ...]] = {}
        for row in rows:
            first.setdefault(row[0], row)  # a repeated id within the call is a duplicate
        unique = list(first.values())
        groups = sql.group_by_metric_day(unique)
        pending = Pending(unique, list(first), b"".join(first), self._insert_statements(groups),
                          self._aggregate_groups(groups), cap)
        self._commit(pending)
        if pending.refused is not None:
            raise pending.refused
        return InsertResult(pending.accepted, len(rows) - pending.accepted)

    def _commit(self, pending: Pending) -> None:
        """Store ``pending`` in a write transaction, together with any other calls waiting."""
        self.commits.enqueue(pending)
        with self.commits.lock:
            if not pending.done:  # no earlier holder of the lock took it: lead a group
                group: list[Pending] = []
                try:
                    with self._transaction() as conn:
                        # take the queue once the transaction has begun, so the group also
                        # holds every call that arrived while waiting for other processes
                        group = self.commits.take()
                        new_ids, last_rowid = self._store(conn, group)
                    # committed: only now may this process's copy of recent_ids hold them
                    self._recent.committed(new_ids, last_rowid)
                except BaseException as exc:
                    self._recent.invalidate()
                    group = group or self.commits.take()
                    for other in [*group, pending]:
                        other.error = exc
                    if not isinstance(exc, sqlite3.Error | sql.DamagedRow):
                        raise
                finally:
                    for other in group:
                        other.done = True
                if self._recent.full:
                    self._merge_recent_ids()
        if pending.error is not None:
            raise self._failure("commit the write transaction", pending.error) from pending.error

    def _store(self, conn: sqlite3.Connection, group: list[Pending]) -> tuple[list[bytes], int]:
        """Insert the reports of ``group`` whose ids are new, and update the aggregates.

        An id is new unless the file holds it already or it is earlier in the group
        (in a call the group stores: a call refused by its cap stores nothing).
        Returns the new ids and the last rowid of ``recent_ids`` once they are appended.
        """
        self._recent.sync(conn)
        group_ids = [report_id for pending in group for report_id in pending.id_list]
        joined = b"".join(pending.ids for pending in group)
        known = self._recent.known(conn, group_ids, joined)
        # some ids were stored before or repeat an earlier call of the group: store exactly
        # the new rows, each call in order, so a later call sees an earlier one's
        repeats = bool(known) or (len(group) > 1 and len(set(group_ids)) < len(group_ids))
        new_ids: list[bytes] = []
        for pending in group:
            fresh = ([row for row in pending.unique if row[0] not in known] if repeats
                     else pending.unique)
            if pending.cap is not None and fresh and not self._charge_cap(conn, pending,
                                                                          len(fresh)):
                pending.statements, pending.aggregates = [], []
                continue
            if len(fresh) < len(pending.unique):
                groups = sql.group_by_metric_day(fresh)
                pending.statements = self._insert_statements(groups)
                pending.aggregates = self._aggregate_groups(groups)
            if repeats:
                known.update(row[0] for row in fresh)
            new_ids.extend(row[0] for row in fresh)
            pending.accepted = len(fresh)
        if len(new_ids) < len(group_ids):
            joined = b"".join(new_ids)
        last_rowid = self._recent.append(conn, joined)
        for pending in group:
            for statement, parameters, many in pending.statements:
                if many:
                    conn.executemany(statement, parameters)
                else:
                    conn.execute(statement, parameters)
        conn.executemany(sql.UPSERT, [row for pending in group for row in pending.aggregates])
        return new_ids, last_rowid

    @staticmethod
    def _charge_cap(conn: sqlite3.Connection, pending: Pending, reports: int) -> bool:
        """Count ``reports`` new reports of ``pending`` under its cap and day in the group's
        transaction; ``False`` (and ``pending.refused`` set, nothing counted) if they would
        exceed it."""
        assert pending.cap is not None
        key, limit, day = pending.cap.key, pending.cap.limit, pending.unique[0][2]
        row = conn.execute("SELECT reports FROM cap_counts WHERE key = ? AND day = ?",
                           (key, day)).fetchone()
        stored = int(row[0]) if row else 0
        if stored + reports > limit:
            pending.refused = DailyCapReached(limit, day, stored,
                                              seconds_left_in_day(day, time.time()))
            return False
        conn.execute("INSERT INTO cap_counts (key, day, reports) VALUES (?, ?, ?) "
                     "ON CONFLICT (key, day) DO UPDATE SET reports = reports + excluded.reports",
                     (key, day, reports))
        return True

    def _merge_recent_ids(self) -> None:
        """Merge ``recent_ids`` into the index in one transaction (the caller holds the lock).

        The caller's reports are already committed: a failed merge is logged and
        tried again after a later commit, and loses nothing (the ids stay in
        ``recent_ids``).
        """
        try:
            with self._transaction() as conn:
                self._recent.merge(conn)
        except (sqlite3.Error, sql.DamagedRow, StorageError) as exc:
            logger.warning("merging recent report ids into the index failed (will retry): %s",
                           self._failure("merge recent ids", exc))
        finally:
            self._recent.invalidate()

    def _insert_statements(self, groups: dict[tuple[str, str], list[tuple[Any, ...]]],
                           ) -> list[Statement]:
        """One statement per (metric, day) group that appends its rows to ``reports``."""
        return [sql.insert_statement(self._metric(name)[1], name, day, group)
                for (name, day), group in groups.items()]

    def _aggregate_groups(self, groups: dict[tuple[str, str], list[tuple[Any, ...]]],
                          ) -> list[tuple[Any, ...]]:
        """Upsert rows ``(metric, day, cohort, reports, *COLUMNS)`` of grouped report rows."""
        return sql.aggregate_groups(groups, self._metric)

    def iter_reports(self, metric: str | None = None, start: str | None = None,
                     end: str | None = None, *, batch_size: int = 262_144,
                     ) -> Iterator[StoredReports]:
        """One scan of ``reports`` in a read transaction (arrival order mixes metrics and
        days: rows wait per (metric, day) until ``batch_size`` of them, or the end)."""
        query = ("SELECT metric, day, id, cohort, payload FROM reports WHERE day BETWEEN ? AND ?"
                 + (" AND metric = ?" if metric is not None else ""))
        parameters = (start or "", end or LAST_DAY, *(() if metric is None else (metric,)))
        waiting: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        with self._unavailable(f"read the reports in {self.path}"), self._reader() as conn:
            conn.execute("BEGIN")
            try:
                cursor = conn.execute(query, parameters)
                while chunk := cursor.fetchmany(50_000):
                    for row in chunk:
                        group = waiting.setdefault((row[0], row[1]), [])
                        group.append(row)
                        if len(group) >= batch_size:
                            yield self._stored_reports(waiting.pop((row[0], row[1])))
            finally:
                conn.execute("ROLLBACK")
        for key in sorted(waiting):
            yield self._stored_reports(waiting[key])

    def _stored_reports(self, rows: list[tuple[Any, ...]]) -> StoredReports:
        """``(metric, day, id, cohort, payload)`` rows of one (metric, day) as arrays."""
        name, day = rows[0][0], rows[0][1]
        statistic = self._metric(name)[1]
        try:
            return StoredReports(
                name, day,
                np.frombuffer(b"".join(row[2] for row in rows), dtype=np.uint8).reshape(-1, 16),
                np.fromiter((row[3] for row in rows), dtype=np.int64, count=len(rows)),
                payload_array(statistic.payload_type, [row[4] for row in rows]))
        except (ValueError, TypeError) as exc:
            raise StorageUnavailable(self._explain(sql.DamagedRow(
                f"a stored report of metric {name!r} is malformed ({exc})"))) from exc

    def replace_aggregates(self, metric: str, day: str, reports: np.ndarray,
                           states: Sequence[State]) -> None:
        day_text = parse_day(day, "day")
        stored, statistic = self._metric(metric)
        rows = [sql.aggregate_row(metric, str(day_text), c, int(reports[c]), statistic, states[c])
                for c in range(stored.params.cohorts) if reports[c]]
        with self._unavailable(f"write the aggregates of {metric!r} on {day_text} to {self.path}"), \
                self._write() as conn:
            conn.execute("DELETE FROM aggregates WHERE metric = ? AND day = ?", (metric, day_text))
            conn.executemany(sql.UPSERT, rows)

    def rebuild_aggregates(self) -> int:
        """Recompute every aggregate from the raw ``reports`` table in one transaction."""
        with self._unavailable(f"rebuild the aggregates of {self.path}"), self._write() as conn:
            return self.rebuild_in(conn)

    def rebuild_in(self, conn: sqlite3.Connection) -> int:
        """:meth:`rebuild_aggregates` inside a transaction the caller holds (and migrations)."""
        return sql.recount(conn, self._metric)

    def backup(self, target: str | Path) -> Path:
        """Write a consistent, compacted copy of the database to ``target`` (``VACUUM INTO``).

        Safe while the collector runs: the copy is one read transaction's snapshot.
        """
        return self._vacuum_into(Path(target), self._reader())

    def _vacuum_into(self, target: Path,
                     connection: contextlib.AbstractContextManager[sqlite3.Connection]) -> Path:
        """:meth:`backup` through the connection ``connection`` gives."""
        problem = path_problem(target, create=True, what="backup")
        if problem is not None:
            raise StorageError(problem)
        try:  # created empty and private first (VACUUM INTO fills an empty file): it holds
            # everyone's reports, whatever the umask
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            raise StorageError(f"{target} exists; choose a new file for the backup") from None
        except OSError as exc:
            raise StorageError(f"cannot create the backup {target}: {exc.strerror}") from None
        try:
            with self._unavailable(f"write the backup to {target}"), connection as conn:
                conn.execute("VACUUM INTO ?", (str(target),))
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def check(cls, url: str) -> CheckResult:
        """``PRAGMA integrity_check`` of the whole file, then every aggregate recounted from the
        raw reports and compared with the stored one, all in one read transaction: the file
        is not changed, and a running collector keeps writing meanwhile."""
        path = cls._existing_file(url)
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {path}: {exc}") from None
        conn.create_function("add_counts", 2, sql.add_counts, deterministic=True)
        try:
            conn.execute("BEGIN")
            return cls._check_in(conn, path)
        except (sqlite3.Error, sql.DamagedRow) as exc:
            if not (isinstance(exc, sql.DamagedRow) or _is_damage(exc)):
                raise StorageError(f"cannot check {path}: {exc}") from None
            return CheckResult(str(path), damage=(" ".join(str(exc).split()),))
        finally:
            conn.close()  # rolls the read transaction and the recount back

    @classmethod
    def _check_in(cls, conn: sqlite3.Connection, path: Path) -> CheckResult:
        """:meth:`check` inside the read transaction of ``conn``."""
        problems = [" ".join(row[0].split()) for row in
                    conn.execute(f"PRAGMA integrity_check({CHECK_MAX_PROBLEMS})")]
        if problems != ["ok"]:
            return CheckResult(str(path), damage=tuple(problems))
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if 0 < version < SCHEMA_VERSION:
            raise SchemaOutdatedError(str(path), version, SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise StorageError(
                f"{path} has schema version {version} and this Veil checks version "
                f"{SCHEMA_VERSION}: check it with the Veil that wrote it"
            )
        registry = cls._stored_registry(conn)
        metrics = {name: (metric, statistic_for(metric.params))
                   for name, metric in (registry.items() if registry else ())}

        def metric_of(name: str) -> tuple[Metric, Statistic]:
            if name not in metrics:
                raise StorageError(f"a report of metric {name!r}, which the registry lacks")
            return metrics[name]

        conn.execute(RECOUNT)
        reports = sql.recount(conn, metric_of)
        return CheckResult(str(path), mismatches=tuple(sql.differences(conn)), reports=reports)

    # -- reads -------------------------------------------------------------------

    def total_reports(self, metric: str | None = None) -> int:
        with self._unavailable(f"count the reports in {self.path}"), self._reader() as conn:
            if metric is None:
                return int(conn.execute("SELECT count(*) FROM reports").fetchone()[0])
            return int(conn.execute(
                "SELECT count(*) FROM reports WHERE metric = ?", (metric,)).fetchone()[0])

    def daily_reports(self, metric: str | None, start: str | None, end: str | None,
                      ) -> list[DayCount]:
        query = ("SELECT metric, day, sum(reports) FROM aggregates WHERE day BETWEEN ? AND ? "
                 + ("AND metric = ? " if metric is not None else "")
                 + "GROUP BY metric, day ORDER BY metric, day")
        parameters = (start or "", end or LAST_DAY, *(() if metric is None else (metric,)))
        with self._unavailable(f"count the reports per day in {self.path}"), \
                self._reader() as conn:
            rows = conn.execute(query, parameters).fetchall()
        return [DayCount(name, day, int(reports)) for name, day, reports in rows]

    def read_aggregates(self, metric: Metric, start: str | None, end: str | None,
                        ) -> tuple[np.ndarray, list[State]]:
        with self._unavailable(f"read the counts in {self.path}"):
            with self._reader() as conn:
                rows = conn.execute(sql.SELECT_AGGREGATES,
                                    (metric.name, start or "", end or LAST_DAY)).fetchall()
            return sql.sum_aggregates(statistic_for(metric.params), metric, rows)
