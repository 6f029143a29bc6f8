"""Durable storage of randomized reports and their per-cohort sufficient statistics.

The collector keeps these in one SQLite file:

* ``reports``: every accepted randomized report (16-byte id, metric, UTC day of
  receipt, cohort, payload) in arrival order, so aggregates can always be
  rebuilt and audited;
* the id of every accepted report, the set that recognizes a retried or
  replayed report as a duplicate, in two tables: ``recent_ids``, where new ids
  are appended, and ``report_ids``, the sorted index they are merged into in
  bulk (see :meth:`SQLiteStorage._merge_recent_ids`);
* ``aggregates``: per ``(metric, day, cohort)`` sufficient statistics, updated in
  the same transaction as the raw insert, so reading counts touches one row per
  day and cohort whatever the number of reports.

Each metric keeps the statistic its kind names (:mod:`veil.shared.statistics`):
an aggregate row holds the number of reports and the statistic's fields, each in
its column (``bit_counts``, a BLOB of little-endian uint64 counters; ``ones``;
``sum``; ``sum_squares``); columns a statistic does not use are NULL.

Durability: WAL journal with ``synchronous=FULL``, so every commit is fsynced to
the WAL before :meth:`SQLiteStorage.insert` returns; the HTTP layer answers 2xx
only after that. Writes from many threads go through one writer connection
guarded by a lock; across processes (several ``veil serve`` workers, or
``veil rebuild-aggregates`` beside a running server) writers take an exclusive
``flock`` on ``<db>.lock`` and then ``BEGIN IMMEDIATE`` (with a busy timeout),
so they queue instead of failing. Inserts that queue behind the lock are
committed together by whichever gets it first (group commit, see
:meth:`SQLiteStorage._commit`).

This module imports NumPy but never Flask: the analysis reads counts with
``open_storage(path).counts(metric)`` and no HTTP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: processes serialize on SQLite's busy timeout alone
    fcntl = None  # type: ignore[assignment]

from veil.shared.errors import VeilError
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import COLUMNS, STATISTICS, Statistic, statistic_for
from veil.shared.wire import Report

#: schema version written to ``PRAGMA user_version``; see :data:`MIGRATIONS`
SCHEMA_VERSION = 4
#: how long a write waits for another process's write transaction (milliseconds)
BUSY_TIMEOUT_MS = 30_000
#: page size of new files (bytes). Random report ids spread the ids merged into the index over
#: many leaf pages, and each page a transaction changes goes to the WAL whole: 1 KiB pages write
#: a quarter of the bytes of SQLite's default 4 KiB (measured with schema 3, which inserted ids
#: batch by batch: about 25% less time per batch)
PAGE_SIZE = 1024
#: page cache per connection (KiB): random 16-byte ids touch pages all over the id B-tree
CACHE_KIB = 64 * 1024
#: WAL pages before an automatic checkpoint (~40 MiB): merges into the id index dirty many
#: pages, and checkpointing less often writes each hot page to the database file fewer times
WAL_CHECKPOINT_PAGES = (40 << 20) // PAGE_SIZE
#: memory-mapped reads: when another process commits, a mapped page costs nothing to re-read,
#: where a private page cache would be dropped and refilled by copying
MMAP_BYTES = 1 << 30
#: ids appended to ``recent_ids`` before they are merged into ``report_ids``. Each worker
#: process keeps a copy of them in memory (about 100 bytes an id, 13 MiB at this limit); a
#: larger limit merges less often (fewer index pages written per id) in longer pauses
RECENT_IDS_LIMIT = 131_072

DAY_FORMAT = "%Y-%m-%d"

logger = logging.getLogger(__name__)


class StorageError(VeilError):
    """The database cannot be opened or used as asked (wrong file, newer schema, ...)."""


class RegistryMismatchError(StorageError):
    """A registry changes a metric's parameters although reports under the old ones are stored."""


class TooFewReportsError(VeilError):
    """Fewer reports than the metric's ``min_reports`` in the requested range.

    Small batches of reports leak more about each person, so counts are
    refused; an operator may override with ``min_reports=0`` (``--force``).
    """

    def __init__(self, metric: str, reports: int, min_reports: int) -> None:
        self.metric = metric
        self.reports = reports
        self.min_reports = min_reports
        super().__init__(
            f"metric {metric!r} has {reports} reports in the requested range; at least "
            f"{min_reports} (its min_reports) are needed before counts are released. "
            "Widen the date range or wait for more reports."
        )


@dataclasses.dataclass(frozen=True)
class InsertResult:
    """How many reports of an insert were new and how many were already stored."""

    accepted: int
    duplicates: int


@dataclasses.dataclass(eq=False)
class _Pending:
    """One :meth:`SQLiteStorage.insert` call waiting for a write transaction.

    ``unique`` holds the call's ``(id, metric, day, cohort, payload)`` rows with
    distinct ids, ``id_list`` their ids and ``ids`` the ids joined; ``statements``
    and ``aggregates`` store them all, prepared before the write lock for the
    common case that every id is new.
    """

    unique: list[tuple]
    id_list: list[bytes]
    ids: bytes
    statements: list[_Statement]
    aggregates: list[tuple]
    accepted: int = 0
    done: bool = False
    error: BaseException | None = None


class Storage(Protocol):
    """What the collector needs from a storage backend."""

    @property
    def registry(self) -> Registry:
        """The metrics whose reports this store holds."""
        ...

    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None) -> InsertResult:
        """Store reports durably (ids already stored count as duplicates)."""
        ...

    def counts(
        self,
        metric: Metric,
        start: dt.date | str | None = None,
        end: dt.date | str | None = None,
        *,
        min_reports: int | None = None,
    ) -> dict[str, Any]:
        """The counts document for ``metric`` between ``start`` and ``end`` (inclusive)."""
        ...

    def rebuild_aggregates(self) -> int:
        """Recompute every aggregate from the raw reports; return the number of reports."""
        ...

    def ping(self) -> None:
        """Raise :class:`StorageError` if the store cannot answer a query."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


#: SQL, its parameters, and whether they are a sequence of rows for ``executemany``
_Statement = tuple[str, Any, bool]


def _run(conn: sqlite3.Connection, statements: list[_Statement]) -> None:
    """Execute statements prepared by :meth:`SQLiteStorage._insert_statements`."""
    for sql, parameters, many in statements:
        if many:
            conn.executemany(sql, parameters)
        else:
            conn.execute(sql, parameters)


def _group_by_metric_day(rows: Iterable[tuple]) -> dict[tuple[str, str], list[tuple]]:
    """``(id, metric, day, cohort, payload)`` rows grouped by ``(metric, day)``."""
    groups: dict[tuple[str, str], list[tuple]] = {}
    for row in rows:
        groups.setdefault((row[1], row[2]), []).append(row)
    return groups


def _columns(statistic: Statistic, state: dict[str, Any]) -> list[Any]:
    """The aggregate columns (:data:`COLUMNS`) of one cohort's ``state``; unused ones NULL."""
    out: list[Any] = [None] * len(COLUMNS)
    for field in statistic.fields:
        value = state[field.name]
        if field.type == "counts":
            value = np.asarray(value).astype("<u8").tobytes()
        elif field.type == "count":
            value = int(value)
        else:
            value = float(value)
        out[COLUMNS.index(field.column)] = value
    return out


def _sum_columns(statistic: Statistic, metric: Metric, rows: Sequence[tuple],
                 cohort_ids: np.ndarray) -> list[dict[str, Any]]:
    """Per-cohort states summed from aggregate rows ``(cohort, reports, *COLUMNS)``."""
    cohorts = metric.params.cohorts
    states = [statistic.zero(metric.params) for _ in range(cohorts)]
    for field in statistic.fields:
        at = 2 + COLUMNS.index(field.column)
        if field.type == "counts":
            length = statistic.length(metric.params)
            total = np.zeros((cohorts, length), dtype=np.uint64)
            if rows:
                blobs = np.frombuffer(b"".join(row[at] for row in rows), dtype="<u8")
                np.add.at(total, cohort_ids, blobs.reshape(-1, length))
            for c in range(cohorts):
                states[c][field.name] = total[c]
        else:
            for row in rows:
                states[row[0]][field.name] += row[at]
    return states


def parse_day(value: dt.date | str | None, field: str) -> str | None:
    """A UTC day as ``YYYY-MM-DD`` (``None`` passes through); raise :class:`StorageError`."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return value.strftime(DAY_FORMAT)
    if isinstance(value, str):
        try:
            return dt.datetime.strptime(value, DAY_FORMAT).date().strftime(DAY_FORMAT)
        except ValueError:
            pass
    raise StorageError(f"{field} must be a day written YYYY-MM-DD; got {value!r}")


def today() -> str:
    """Today's UTC day, the day under which new reports are filed."""
    return dt.datetime.now(dt.UTC).strftime(DAY_FORMAT)


def _add_counts(left: bytes | None, right: bytes | None) -> bytes | None:
    """SQL function ``add_counts``: element-wise sum of two uint64 counter BLOBs."""
    if left is None:
        return right
    if right is None:
        return left
    a = np.frombuffer(left, dtype="<u8")
    b = np.frombuffer(right, dtype="<u8")
    if a.shape != b.shape:
        raise ValueError("add_counts: counter blobs of different lengths")
    return (a + b).tobytes()


_META = """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"""

# Raw reports are an append-only log (a rowid table: a batch fills a few consecutive pages),
# and their ids a separate narrow set that answers "seen before?". Random ids land on random
# pages of whichever B-tree is keyed by them, and every page a transaction dirties is written
# to the WAL whole; keying only the 16-byte ids (about 45 to a page) instead of whole reports
# cuts the bytes written and the time under the write lock by about a third.
_REPORTS = """CREATE TABLE IF NOT EXISTS reports (
    id BLOB NOT NULL,
    metric TEXT NOT NULL,
    day TEXT NOT NULL,
    cohort INTEGER NOT NULL,
    payload ANY
) STRICT"""

_REPORT_IDS = """CREATE TABLE IF NOT EXISTS report_ids (id BLOB PRIMARY KEY) STRICT, WITHOUT ROWID"""

# Ids of new reports are appended here (a batch fills a few consecutive pages) and merged
# into ``report_ids`` in bulk, sorted, once there are ``RECENT_IDS_LIMIT`` of them: inserted
# one batch at a time, 1,000 random ids land on about 1,000 different pages of the index,
# each written whole to the WAL; merged sorted, a page takes all of its new ids at once.
# ``ids_generation`` in ``meta`` counts the merges, so a process holding the table's rows in
# memory sees that it was emptied.
_RECENT_IDS = """CREATE TABLE IF NOT EXISTS recent_ids (id BLOB NOT NULL) STRICT"""
_IDS_GENERATION = "INSERT OR IGNORE INTO meta (key, value) VALUES ('ids_generation', '0')"

_AGGREGATES = """CREATE TABLE IF NOT EXISTS aggregates (
    metric TEXT NOT NULL,
    day TEXT NOT NULL,
    cohort INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    bit_counts BLOB,
    ones INTEGER,
    sum REAL,
    sum_squares REAL,
    PRIMARY KEY (metric, day, cohort)
) STRICT, WITHOUT ROWID"""


def _migrate_1_to_2(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Version 1 stored raw reports only; version 2 adds the aggregate table."""
    conn.execute(_AGGREGATES)
    stored = storage._stored_registry(conn)
    if stored is None:
        raise StorageError(f"{storage.path}: cannot migrate a file without a stored registry")
    storage._use_registry(stored)
    storage._rebuild_in(conn)


def _migrate_2_to_3(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Version 2 kept raw reports in a table keyed by id; version 3 appends them to a
    rowid table and keeps their ids in ``report_ids``."""
    conn.execute("ALTER TABLE reports RENAME TO reports_v2")
    conn.execute(_REPORTS)
    conn.execute(_REPORT_IDS)
    conn.execute("INSERT INTO report_ids (id) SELECT id FROM reports_v2")
    conn.execute(
        "INSERT INTO reports (id, metric, day, cohort, payload) "
        "SELECT id, metric, day, cohort, payload FROM reports_v2 ORDER BY day, metric"
    )
    conn.execute("DROP TABLE reports_v2")


def _migrate_3_to_4(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Version 3 inserted each id into ``report_ids`` directly; version 4 appends new ids to
    ``recent_ids`` and merges them into ``report_ids`` in bulk."""
    conn.execute(_RECENT_IDS)
    conn.execute(_IDS_GENERATION)


#: ``from_version -> step``: each step upgrades a file by one version inside one transaction
MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4}

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
_INSERT_REPORT = "INSERT INTO reports (id, metric, day, cohort, payload) VALUES (?, ?, ?, ?, ?)"
# One statement appends a whole group of reports: the ids (and bit payloads) travel as
# one concatenated blob cut with substr(), the cohorts (and 0/1 payloads) as a JSON array
# walked by json_each, so SQLite runs the loop in C. executemany instead re-acquires the
# GIL for every row, and while other request threads run Python that stalls the writer,
# which holds the lock every writer waits on.
_INSERT_BITS = (
    "INSERT INTO reports (id, metric, day, cohort, payload) "
    "SELECT substr(?1, key * 16 + 1, 16), ?2, ?3, value, substr(?4, key * ?5 + 1, ?5) "
    "FROM json_each(?6)"
)
_INSERT_ONES = (
    "INSERT INTO reports (id, metric, day, cohort, payload) "
    "SELECT substr(?1, key * 16 + 1, 16), ?2, ?3, value ->> 0, value ->> 1 FROM json_each(?4)"
)
#: the type of field each statistic column holds (``counts`` columns add up with add_counts)
_COLUMN_TYPES = {field.column: field.type for statistic in STATISTICS.values()
                 for field in statistic.fields}
_UPSERT = (
    f"INSERT INTO aggregates (metric, day, cohort, reports, {', '.join(COLUMNS)}) "
    f"VALUES (?, ?, ?, ?{', ?' * len(COLUMNS)}) "
    "ON CONFLICT (metric, day, cohort) DO UPDATE SET reports = reports + excluded.reports, "
    + ", ".join(
        f"{c} = add_counts({c}, excluded.{c})" if _COLUMN_TYPES[c] == "counts"
        else f"{c} = {c} + excluded.{c}"
        for c in COLUMNS
    )
)


class SQLiteStorage:
    """Reports and aggregates in one SQLite file (WAL, ``synchronous=FULL``).

    Thread-safe: writes are serialized on one connection under a lock, reads use
    pooled connections (WAL readers never block the writer).
    """

    def __init__(self, path: str | Path, registry: Registry | None = None, *, create: bool = False,
                 recent_ids_limit: int = RECENT_IDS_LIMIT):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise StorageError(
                f"no Veil database at {self.path}; start the collector with this --db first"
            )
        if isinstance(recent_ids_limit, bool) or not isinstance(recent_ids_limit, int) \
                or recent_ids_limit < 1:
            raise StorageError(f"recent_ids_limit must be a positive integer; got {recent_ids_limit!r}")
        self._recent_limit = recent_ids_limit
        # this process's copy of ``recent_ids``: the ids, the last rowid read, and the
        # ``ids_generation`` they belong to (None: read the table again)
        self._recent: set[bytes] = set()
        self._recent_rowid = 0
        self._recent_generation: int | None = None
        self._write_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._queue_lock = threading.Lock()
        self._idle_readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._metrics_cache: dict[str, tuple[Metric, str]] = {}
        self._registry = Registry([], version=1)
        self._writer = self._connect()
        self._lock_fd = self._open_lock_file()
        try:
            self._migrate()
            self._registry = self._attach(registry)
        except BaseException:
            self.close()
            raise

    # -- connections -------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the database {self.path}: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StorageError(f"{self.path} is not a usable SQLite database: {exc}") from None
        if mode.lower() != "wal":
            conn.close()
            raise StorageError(f"{self.path}: cannot switch to WAL journal mode (got {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.create_function("add_counts", 2, _add_counts, deterministic=True)
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
                raise StorageError("the storage is closed")
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        finally:
            with self._readers_lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle_readers.append(conn)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: lock, ``BEGIN IMMEDIATE``, commit or roll back."""
        with self._write_lock, self._transaction() as conn:
            yield conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """:meth:`_write` for a caller that already holds ``_write_lock``."""
        if self._closed:
            raise StorageError("the storage is closed")
        conn = self._writer
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close every connection (idempotent)."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
        with self._readers_lock:
            for conn in self._idle_readers:
                conn.close()
            self._idle_readers.clear()

    def __enter__(self) -> SQLiteStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> None:
        """Raise :class:`StorageError` unless a trivial query succeeds."""
        try:
            with self._reader() as conn:
                conn.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"database {self.path} is not answering: {exc}") from None

    # -- schema ------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        """The file's ``PRAGMA user_version``."""
        return int(self._writer.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        with self._write() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"{self.path} has schema version {version}, newer than this Veil "
                    f"({SCHEMA_VERSION}); upgrade Veil to open it"
                )
            if version == 0:
                tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
                if tables:
                    raise StorageError(f"{self.path} is an SQLite file but not a Veil database")
                for statement in (_META, _REPORTS, _REPORT_IDS, _RECENT_IDS, _IDS_GENERATION,
                                  _AGGREGATES):
                    conn.execute(statement)
                version = SCHEMA_VERSION
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](self, conn)
                version += 1
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- registry ----------------------------------------------------------------

    def _stored_registry(self, conn: sqlite3.Connection) -> Registry | None:
        row = conn.execute("SELECT value FROM meta WHERE key = 'registry'").fetchone()
        return Registry.from_dict(json.loads(row[0])) if row else None

    def _attach(self, registry: Registry | None) -> Registry:
        """Record ``registry`` in the file, refusing parameter changes for metrics with data.

        Metrics dropped from ``registry`` but holding reports stay in the stored
        registry so that their counts can still be exported and decoded.
        """
        with self._write() as conn:
            stored = self._stored_registry(conn)
            if registry is None:
                if stored is None:
                    raise StorageError(
                        f"{self.path} holds no metric registry yet; start the collector with "
                        "--config to record one"
                    )
                self._use_registry(stored)
                return stored
            if stored is None:
                merged = registry
            else:
                with_data = {
                    row[0] for row in conn.execute("SELECT DISTINCT metric FROM aggregates")
                }
                for name in sorted(with_data & set(stored) & set(registry)):
                    if stored[name].params != registry[name].params:
                        raise RegistryMismatchError(
                            f"metric {name!r}: the registry changes its parameters "
                            f"({stored[name].params.to_dict()} -> {registry[name].params.to_dict()}) "
                            f"but {self.path} holds reports made with the old ones; give the "
                            "changed metric a new name instead"
                        )
                kept = [stored[name] for name in sorted(with_data & set(stored)) if name not in registry]
                merged = Registry([*registry.values(), *kept], version=registry.version)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('registry', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (json.dumps(merged.to_dict(), sort_keys=True),),
            )
            self._use_registry(merged)
            return merged

    def _use_registry(self, registry: Registry) -> None:
        self._registry = registry
        self._metrics_cache = {}

    @property
    def registry(self) -> Registry:
        """Every metric with stored reports or in the registry last attached."""
        return self._registry

    def _metric(self, name: str) -> tuple[Metric, Statistic]:
        cached = self._metrics_cache.get(name)
        if cached is None:
            if name not in self._registry:
                raise StorageError(f"metric {name!r} is not in the registry stored in {self.path}")
            metric = self._registry[name]
            cached = (metric, statistic_for(metric.params))
            self._metrics_cache[name] = cached
        return cached

    def _check_metric(self, metric: Metric) -> Statistic:
        stored, statistic = self._metric(metric.name)
        if stored.params != metric.params:
            raise RegistryMismatchError(
                f"metric {metric.name!r}: the parameters given ({metric.params.to_dict()}) differ "
                f"from those stored in {self.path} ({stored.params.to_dict()})"
            )
        return statistic

    # -- writes ------------------------------------------------------------------

    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None) -> InsertResult:
        """Store validated reports under ``day`` (default: today, UTC) and update aggregates.

        Reports whose id is already stored, or repeats an earlier report of the
        same call, are duplicates: acknowledged, not counted again. Returns after
        the transaction is committed (fsynced).
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
        first: dict[bytes, tuple] = {}
        for row in rows:
            first.setdefault(row[0], row)  # a repeated id within the call is a duplicate
        unique = list(first.values())
        groups = _group_by_metric_day(unique)
        pending = _Pending(unique, list(first), b"".join(first), self._insert_statements(groups),
                           self._aggregate_groups(groups))
        self._commit(pending)
        return InsertResult(pending.accepted, len(rows) - pending.accepted)

    def _commit(self, pending: _Pending) -> None:
        """Store ``pending`` in a write transaction, together with any other calls waiting.

        Group commit: whichever thread gets the write lock stores every insert queued
        meanwhile in one transaction. Rows that land on the same pages (the appended
        ids and reports, one aggregate row per cohort) are then written to the WAL
        once per group rather than once per call, and the commit's fsync is shared.
        The calls of a group succeed or fail together, and each returns only after
        the commit.
        """
        with self._queue_lock:
            self._queue.append(pending)
        with self._write_lock:
            if not pending.done:  # no earlier holder of the lock took it: lead a group
                group: list[_Pending] = []
                try:
                    with self._transaction() as conn:
                        # take the queue once the transaction has begun, so the group also
                        # holds every call that arrived while waiting for other processes
                        group = self._take_queue()
                        new_ids, last_rowid = self._store(conn, group)
                    # committed: only now may this process's copy of recent_ids hold them
                    self._recent.update(new_ids)
                    self._recent_rowid = last_rowid
                except BaseException as exc:
                    self._recent_generation = None
                    group = group or self._take_queue()
                    for other in group:
                        other.error = exc
                    raise
                finally:
                    for other in group:
                        other.done = True
                if len(self._recent) >= self._recent_limit:
                    self._merge_recent_ids()
        if pending.error is not None:
            raise StorageError(f"the write transaction failed: {pending.error}") from pending.error

    def _take_queue(self) -> list[_Pending]:
        with self._queue_lock:
            group, self._queue = self._queue, []
        return group

    def _sync_recent_ids(self, conn: sqlite3.Connection) -> None:
        """Bring this process's copy of ``recent_ids`` up to date, inside a write transaction.

        Other processes only append to the table between merges, so reading the
        rows after the last one seen is enough; a merge (a new ``ids_generation``)
        empties it, and the copy starts over.
        """
        row = conn.execute("SELECT value FROM meta WHERE key = 'ids_generation'").fetchone()
        if row is None:
            raise StorageError(f"{self.path} lacks its ids_generation entry in meta: the file is "
                               "damaged; restore it from a backup")
        generation = int(row[0])
        if generation != self._recent_generation:
            self._recent = set()
            self._recent_rowid = 0
            self._recent_generation = generation
        # one row (hex of every new id joined) rather than a row per id: each row stepped
        # releases and retakes the GIL, which request threads of this process also want
        last, joined = conn.execute(
            "SELECT max(rowid), group_concat(hex(id), '') FROM recent_ids WHERE rowid > ?",
            (self._recent_rowid,),
        ).fetchone()
        if last is not None:
            new = bytes.fromhex(joined)
            self._recent.update([new[i : i + 16] for i in range(0, len(new), 16)])
            self._recent_rowid = last

    def _store(self, conn: sqlite3.Connection, group: list[_Pending]) -> tuple[list[bytes], int]:
        """Insert the reports of ``group`` whose ids are new, and update the aggregates.

        An id is new unless it is in ``recent_ids`` (this process's copy, brought up
        to date first), in the ``report_ids`` index, or earlier in the group. Returns
        the new ids and the last rowid of ``recent_ids`` once they are appended.
        """
        self._sync_recent_ids(conn)
        group_ids = [report_id for pending in group for report_id in pending.id_list]
        joined = b"".join(pending.ids for pending in group)
        known = self._recent.intersection(group_ids)
        known.update(row[0] for row in conn.execute(_INDEXED_IDS, (joined,)))
        if known or (len(group) > 1 and len(set(group_ids)) < len(group_ids)):
            # some ids were stored before or repeat an earlier call of the group: store
            # exactly the new rows, each call in order, so a later call sees an earlier one's
            new_ids: list[bytes] = []
            for pending in group:
                fresh = [row for row in pending.unique if row[0] not in known]
                known.update(row[0] for row in fresh)
                new_ids.extend(row[0] for row in fresh)
                groups = _group_by_metric_day(fresh)
                pending.statements = self._insert_statements(groups)
                pending.aggregates = self._aggregate_groups(groups)
                pending.accepted = len(fresh)
            joined = b"".join(new_ids)
        else:
            new_ids = group_ids
            for pending in group:
                pending.accepted = len(pending.unique)
        if new_ids:
            conn.execute(_APPEND_IDS, (joined,))
        for pending in group:
            _run(conn, pending.statements)
        conn.executemany(_UPSERT, [row for pending in group for row in pending.aggregates])
        last_rowid = conn.execute("SELECT coalesce(max(rowid), 0) FROM recent_ids").fetchone()[0]
        return new_ids, last_rowid

    def _merge_recent_ids(self) -> None:
        """Move the ids of ``recent_ids`` into the ``report_ids`` index, in one transaction.

        Sorted, the merge writes each index page once for all the ids it gains. The
        caller holds the write lock and its reports are already committed: a failed
        merge is logged and tried again after a later commit, and loses nothing
        (the ids stay in ``recent_ids``).
        """
        try:
            with self._transaction() as conn:
                self._sync_recent_ids(conn)
                if len(self._recent) < self._recent_limit:
                    return  # another process merged first
                conn.execute(_MERGE_IDS)
                conn.execute("DELETE FROM recent_ids")
                conn.execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) "
                             "WHERE key = 'ids_generation'")
        except (sqlite3.Error, StorageError) as exc:
            logger.warning("merging recent report ids into the index failed (will retry): %s", exc)
        finally:
            self._recent_generation = None

    def _insert_statements(self, groups: dict[tuple[str, str], list[tuple]]) -> list[_Statement]:
        """Statements that insert grouped ``(id, metric, day, cohort, payload)`` rows, one per group.

        Float payloads keep ``executemany``, so that the stored values are the
        exact doubles received (JSON text would be re-parsed by SQLite).
        """
        statements: list[_Statement] = []
        for (name, day), group in groups.items():
            payload_type = self._metric(name)[1].payload_type
            ids = b"".join(row[0] for row in group)
            if payload_type == "bytes":
                width = len(group[0][4])  # validation fixed every payload's length for the metric
                cohorts = json.dumps([row[3] for row in group])
                payloads = b"".join(row[4] for row in group)
                statements.append((_INSERT_BITS, (ids, name, day, payloads, width, cohorts), False))
            elif payload_type == "int":
                pairs = json.dumps([(row[3], row[4]) for row in group])
                statements.append((_INSERT_ONES, (ids, name, day, pairs), False))
            else:
                statements.append((_INSERT_REPORT, group, True))
        return statements

    def _aggregate_rows(self, rows: Iterable[tuple]) -> list[tuple]:
        """Upsert rows ``(metric, day, cohort, reports, *COLUMNS)``."""
        return self._aggregate_groups(_group_by_metric_day(rows))

    def _aggregate_groups(self, groups: dict[tuple[str, str], list[tuple]]) -> list[tuple]:
        """:meth:`_aggregate_rows` for rows already grouped by metric and day."""
        out: list[tuple] = []
        for (name, day), group in groups.items():
            metric, statistic = self._metric(name)
            cohorts = np.fromiter((row[3] for row in group), dtype=np.int64, count=len(group))
            partials = statistic.accumulate(metric.params, cohorts, [row[4] for row in group])
            out.extend((name, day, cohort, reports, *_columns(statistic, state))
                       for cohort, reports, state in partials)
        return out

    def rebuild_aggregates(self) -> int:
        """Recompute every aggregate from the raw ``reports`` table in one transaction."""
        with self._write() as conn:
            return self._rebuild_in(conn)

    def _rebuild_in(self, conn: sqlite3.Connection) -> int:
        conn.execute("DELETE FROM aggregates")
        # no ORDER BY: upserts add up in any order, and arrival order already groups days,
        # where sorting a large table would need a temporary copy of it
        cursor = conn.execute("SELECT id, metric, day, cohort, payload FROM reports")
        total = 0
        while True:
            chunk = cursor.fetchmany(50_000)
            if not chunk:
                break
            conn.executemany(_UPSERT, self._aggregate_rows(chunk))
            total += len(chunk)
        return total

    def backup(self, target: str | Path) -> Path:
        """Write a consistent, compacted copy of the database to ``target`` (``VACUUM INTO``).

        Safe while the collector runs: the copy is one read transaction's snapshot.
        """
        target = Path(target)
        if target.exists():
            raise StorageError(f"{target} exists; choose a new file for the backup")
        try:
            with self._reader() as conn:
                conn.execute("VACUUM INTO ?", (str(target),))
        except sqlite3.Error as exc:
            raise StorageError(f"cannot write the backup to {target}: {exc}") from None
        return target

    # -- reads -------------------------------------------------------------------

    def total_reports(self, metric: str | None = None) -> int:
        """Number of stored raw reports (for one metric or all)."""
        with self._reader() as conn:
            if metric is None:
                return int(conn.execute("SELECT count(*) FROM reports").fetchone()[0])
            return int(conn.execute(
                "SELECT count(*) FROM reports WHERE metric = ?", (metric,)).fetchone()[0])

    def days(self, metric: str) -> list[str]:
        """The days on which ``metric`` received reports, oldest first."""
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT DISTINCT day FROM aggregates WHERE metric = ? ORDER BY day", (metric,)
            ).fetchall()
        return [row[0] for row in rows]

    def counts(
        self,
        metric: Metric | str,
        start: dt.date | str | None = None,
        end: dt.date | str | None = None,
        *,
        min_reports: int | None = None,
    ) -> dict[str, Any]:
        """The counts document for ``metric`` over days ``start``..``end`` (inclusive, UTC).

        Every cohort appears, in order, zeros filled. Raises
        :class:`TooFewReportsError` when the range holds fewer than
        ``min_reports`` reports (default: the metric's own ``min_reports``;
        pass 0 to override).
        """
        if isinstance(metric, str):
            metric = self._metric(metric)[0]
        statistic = self._check_metric(metric)
        start_text, end_text = parse_day(start, "start"), parse_day(end, "end")
        if start_text and end_text and start_text > end_text:
            raise StorageError(f"start ({start_text}) is after end ({end_text})")
        sql = (
            f"SELECT cohort, reports, {', '.join(COLUMNS)} FROM aggregates "
            "WHERE metric = ? AND day >= ? AND day <= ?"
        )
        with self._reader() as conn:
            rows = conn.execute(sql, (metric.name, start_text or "", end_text or "9999-12-31")
                                ).fetchall()
        cohorts = metric.params.cohorts
        reports = np.zeros(cohorts, dtype=np.int64)
        cohort_ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        np.add.at(reports, cohort_ids, [row[1] for row in rows])
        total = int(reports.sum())
        threshold = metric.min_reports if min_reports is None else min_reports
        if total < threshold:
            raise TooFewReportsError(metric.name, total, threshold)
        states = _sum_columns(statistic, metric, rows, cohort_ids)
        entries = [
            {"cohort": c, "reports": int(reports[c]), **statistic.to_entry(states[c])}
            for c in range(cohorts)
        ]
        return {
            "metric": metric.name,
            "kind": metric.kind,
            "params": metric.to_dict(),
            "start": start_text,
            "end": end_text,
            "reports": total,
            "cohorts": entries,
        }


def open_storage(
    path: str | Path, registry: Registry | None = None, *, create: bool = False,
    recent_ids_limit: int = RECENT_IDS_LIMIT,
) -> SQLiteStorage:
    """Open the SQLite store at ``path``.

    With ``registry``, record it in the file (refusing incompatible parameter
    changes); without, use the registry stored by the collector. ``create``
    allows making a new file (the collector does; readers should not).
    ``recent_ids_limit`` is how many new report ids wait in ``recent_ids``
    before a merge into the ``report_ids`` index.
    """
    return SQLiteStorage(path, registry, create=create, recent_ids_limit=recent_ids_limit)
