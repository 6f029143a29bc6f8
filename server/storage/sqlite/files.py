"""The SQLite file under a storage: its connections, its write lock, and what became of it.

:class:`SQLiteFile` is the part of :class:`~veil.server.storage.sqlite.SQLiteStorage`
that holds the open file. Durability: WAL journal with ``synchronous=FULL``, so every
commit is fsynced to the WAL before it returns. Writes from many threads go through one
writer connection guarded by a lock (:attr:`SQLiteFile.commits`); across processes
(several ``veil serve`` workers, or ``veil rebuild-aggregates`` beside a running server)
writers take an exclusive ``flock`` on ``<db>.lock`` and then ``BEGIN IMMEDIATE`` (with a
busy timeout), so they queue instead of failing. Reads use pooled connections.

Damage: opening runs ``PRAGMA quick_check`` and refuses a damaged file with a
:class:`~veil.server.storage.errors.StorageError` that names the recovery; a damaged
page met later fails that call (``StorageUnavailable``) and every readiness
probe after it; a row SQLite reads but Veil never writes fails the calls that
read it.

The file under a running collector: every write transaction first checks that
:attr:`~SQLiteFile.path` still names the open file and that the file has not
shrunk (:meth:`SQLiteFile._open_file_problem`), and refuses with
``StorageUnavailable`` otherwise: a moved or deleted file's acknowledged writes
would land in a ``-wal`` beside the old name that the next opener discards, and a
truncated one is damaged. Reads are not memory-mapped: a page mapped past the
end of a file truncated under the collector kills the process with ``SIGBUS``,
where a read answers SQLite's error. Opening refuses a ``-wal`` with no database
file beside it (:func:`~veil.server.storage.sqlite.paths.orphan_wal_problem`), which
SQLite would delete. The figures behind the settings below are in docs/operations.md (Durability; Recovery for
the check at open).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: processes serialize on SQLite's busy timeout alone
    fcntl = None  # type: ignore[assignment]

from veil.server.storage.base import Storage
from veil.server.storage.errors import NoStoreError, StorageError, StorageUnavailable
from veil.server.storage.sqlite import rows as sql
from veil.server.storage.sqlite.commit import GroupCommit
from veil.server.storage.sqlite.paths import (
    BUSY_TIMEOUT_MS,
    is_damage,
    missing_store,
    not_veil_problem,
    orphan_wal_problem,
    path_problem,
)

#: page size of new files (bytes): random report ids spread the ids merged into the index over
#: many leaf pages, and each page a transaction changes goes to the WAL whole, so small pages
#: write fewer bytes (figures in docs/operations.md)
PAGE_SIZE = 1024
#: page cache per connection (KiB): random 16-byte ids touch pages all over the id B-tree
CACHE_KIB = 64 * 1024
#: WAL pages before an automatic checkpoint (~40 MiB): merges into the id index dirty many
#: pages, and checkpointing less often writes each hot page to the database file fewer times
WAL_CHECKPOINT_PAGES = (40 << 20) // PAGE_SIZE
#: files up to this size are checked whole when opened (``PRAGMA quick_check``, whose time per
#: report is measured in docs/operations.md, Recovery); larger ones check only
#: :data:`OPEN_CHECKED_TABLES` at open, and ``veil check`` examines them whole
QUICK_CHECK_MAX_BYTES = 1 << 30
#: the small tables every request reads, checked at open whatever the file's size
OPEN_CHECKED_TABLES = ("meta", "folded_aggregates", "recent_ids")
#: readiness: the free space the file's filesystem must have for writes to be expected to
#: succeed (room for the WAL to grow to its checkpoint size, about 40 MiB, and a margin)
MIN_FREE_BYTES = 64 << 20
#: readiness: how long the probe waits to begin a write transaction (milliseconds); a writer
#: holding the lock longer is writing, and writes queue behind it, so the probe passes
PING_BUSY_TIMEOUT_MS = 100

logger = logging.getLogger("veil.server.storage")


class HeldFiles:
    """One set of descriptors per database file for the whole process, shared by every
    storage open on it.

    A storage holds a descriptor of its file to learn what became of it (``os.fstat``,
    :meth:`SQLiteFile._open_file_problem`). Closing *any* descriptor of a file drops every
    POSIX lock the process holds on it, SQLite's included: a second storage on the same
    file in one process (the dashboard's discovery beside its own storage, two API calls)
    closing its own descriptor took the first one's locks away, and another process then
    took itself for the file's last user, checkpointed and deleted the ``-wal`` the first
    was still committing to (acknowledged reports lost at the next crash). So a file's
    descriptors are closed only when the last storage on it closes, after its connections.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (st_dev, st_ino) -> (descriptors of that file, storages using them)
        self._held: dict[tuple[int, int], tuple[list[int], int]] = {}

    def acquire(self, path: Path) -> int:
        """A descriptor of the file at ``path`` (opened, or shared with a storage already
        holding it); :class:`OSError` if it cannot be opened."""
        with self._lock:
            try:
                named = os.stat(path)
                key: tuple[int, int] | None = (named.st_dev, named.st_ino)
            except OSError:
                key = None
            if key in self._held:
                fds, users = self._held[key]
                self._held[key] = (fds, users + 1)
                return fds[0]
            fd = os.open(path, os.O_RDONLY)
            opened = os.fstat(fd)
            key = (opened.st_dev, opened.st_ino)
            # the path may name a file already held if it changed since the stat: keep the
            # new descriptor with the others (closing it now would drop their locks)
            fds, users = self._held.get(key, ([], 0))
            self._held[key] = ([*fds, fd], users + 1)
            return fd

    def release(self, fd: int) -> None:
        """A storage holding ``fd`` is done with it (its connections closed): the file's
        descriptors close with the last one."""
        with self._lock:
            for key, (fds, users) in list(self._held.items()):
                if fd in fds:
                    if users > 1:
                        self._held[key] = (fds, users - 1)
                        return
                    del self._held[key]
                    for each in fds:
                        os.close(each)
                    return


#: the process's :class:`HeldFiles`
HELD_FILES = HeldFiles()


class SQLiteFile(Storage):
    """The open SQLite file of a storage: it opens (or creates) the file and holds its
    connections, the write lock, and the checks that the file is sound and still at
    :attr:`path`; the storage built on it (:class:`~.writes.SQLiteWrites`, then
    :class:`~.backend.SQLiteStorage`) reads and writes through :meth:`_reader`,
    :meth:`_write` and :meth:`_transaction`.

    :attr:`commits` is the write lock, and the queue of inserts waiting for it.
    """

    def __init__(self, path: str | Path, *, create: bool, min_free_bytes: int) -> None:
        self.path = Path(path)
        problem = path_problem(self.path, create=create)
        if problem is not None:
            raise StorageError(problem) if create else NoStoreError(problem)
        problem = orphan_wal_problem(self.path)
        if problem is not None:
            raise StorageError(problem)
        if not create and not self.path.exists():
            raise NoStoreError(missing_store(self.path))
        if self.path.exists() and (problem := not_veil_problem(self.path, create)) is not None:
            raise NoStoreError(problem)
        if create:
            # a new file is private whatever the umask: it holds everyone's reports (SQLite
            # gives the -wal and -shm files the database file's mode)
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot create the database {self.path}: {exc.strerror}") from None
        if isinstance(min_free_bytes, bool) or not isinstance(min_free_bytes, int) \
                or min_free_bytes < 0:
            raise StorageError(f"min_free_bytes must be an integer >= 0; got {min_free_bytes!r}")
        #: readiness fails while the file's filesystem has less free space than this
        self.min_free_bytes = min_free_bytes
        self.commits = GroupCommit()
        self._idle_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._damage: str | None = None
        self._file_fd: int | None = None
        self._writer = self._connect()
        self._lock_fd = self._open_lock_file()

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
            if is_damage(exc):
                raise StorageUnavailable(self._damaged(
                    f"it is not a usable SQLite database: {exc}")) from None
            raise StorageUnavailable(self._open_failure(exc)) from None
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
                conn.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (a full disk): a second
                # ROLLBACK would fail and its error replace the one that says why
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
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
        if self._file_fd is not None:  # after the connections: see HeldFiles
            HELD_FILES.release(self._file_fd)

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
        """Hold a descriptor of the database file, so that ``os.fstat`` tells what became of
        the file SQLite has open (:meth:`_open_file_problem`). It is released by
        :meth:`close` after every connection, and closed with the last storage of the
        process on the file (:class:`HeldFiles`): closing a descriptor of a file drops the
        POSIX locks this process holds on it, SQLite's included."""
        try:
            self._file_fd = HELD_FILES.acquire(self.path)
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
        return self._damaged(str(exc)) if is_damage(exc) else str(exc)

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
            if isinstance(exc, sql.DamagedRow) or is_damage(exc):
                raise StorageError(self._explain(exc)) from None
            raise StorageUnavailable(self._open_failure(exc)) from None

    def _open_failure(self, exc: sqlite3.Error) -> str:
        """Why opening failed, with the fix for a read-only file."""
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_READONLY:
            return (f"cannot open the database {self.path}: it (or its directory) is read-only, "
                    "and Veil opens a store with its write-ahead log and write lock even to "
                    f"read it; copy it somewhere writable first (cp {self.path} COPY.db) and "
                    "read the copy")
        return f"cannot open the database {self.path}: {exc}"

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

    def _vacuum_into(self, target: Path,
                     connection: contextlib.AbstractContextManager[sqlite3.Connection]) -> Path:
        """:meth:`backup` through the connection ``connection`` gives."""
        with self._unavailable(f"write the backup to {target}"), connection as conn:
            return vacuum_into(target, conn, self.path)


#: the files SQLite and Veil keep beside a database, by suffix of its name
COMPANION_SUFFIXES = ("-journal", "-wal", "-shm", ".lock")


def vacuum_into(target: Path, conn: sqlite3.Connection, source: Path) -> Path:
    """A consistent, compacted copy of ``conn``'s database (the file ``source``) at
    ``target`` (``VACUUM INTO``), a new private file; :class:`StorageError` if the target
    cannot be one, SQLite's error if the copy fails (the partial file removed)."""
    problem = path_problem(target, create=True, what="backup")
    if problem is not None:
        raise StorageError(problem)
    own = {source.resolve()} | {source.resolve().with_name(source.resolve().name + suffix)
                                for suffix in COMPANION_SUFFIXES}
    if target.resolve() in own:
        # a backup named veil.db-journal is taken for a hot journal and deleted (or
        # applied) by the next opener of veil.db
        raise StorageError(f"{target} is a name SQLite or Veil gives the database's own "
                           "files; choose another name for the backup")
    try:  # created empty and private first (VACUUM INTO fills an empty file): it holds
        # everyone's reports, whatever the umask
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise StorageError(f"{target} exists; choose a new file for the backup") from None
    except OSError as exc:
        raise StorageError(f"cannot create the backup {target}: {exc.strerror}") from None
    try:
        conn.execute("VACUUM INTO ?", (str(target),))
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


def store_file_bytes(location: str) -> int | None:
    """Bytes of a store's database file and its write-ahead log (which exists only while the
    store is open), or None for a store that is not a file (PostgreSQL)."""
    path = Path(location)
    if not path.is_file():
        return None
    size = 0
    for part in (path, Path(f"{path}-wal")):
        with contextlib.suppress(OSError):
            size += part.stat().st_size
    return size
