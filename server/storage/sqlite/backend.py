"""Reports and aggregates in one SQLite file: the default storage backend.

:class:`SQLiteStorage` is built in three layers, one job each: the open file, its
connections, write lock and damage checks (:mod:`~veil.server.storage.sqlite.files`);
the insert path, with its group commit, replay rejection and daily caps
(:mod:`~veil.server.storage.sqlite.writes`); and here, what a store is on top of them:
opening with the schema and the registry, reads, the aggregates' rebuild, backups and
:meth:`SQLiteStorage.check` (``veil check``), which examines a file whole. Tables and
migrations are in :mod:`~veil.server.storage.sqlite.schema`, the SQL of reports and
aggregates in :mod:`~veil.server.storage.sqlite.rows`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from veil.server.storage.base import (
    LAST_DAY,
    CheckResult,
    DayCount,
    Migration,
    StoredReports,
    parse_day,
    payload_array,
    registry_to_record,
)
from veil.server.storage.errors import (
    NoStoreError,
    SchemaNewerError,
    SchemaOutdatedError,
    StorageError,
    StorageUnavailable,
)
from veil.server.storage.sqlite import rows as sql
from veil.server.storage.sqlite import tail
from veil.server.storage.sqlite.files import MIN_FREE_BYTES, vacuum_into
from veil.server.storage.sqlite.paths import (
    BUSY_TIMEOUT_MS,
    is_damage,
    missing_store,
    not_veil_problem,
    not_veil_sentence,
    path_problem,
    read_only,
    read_schema,
)
from veil.server.storage.sqlite.schema import (
    CREATE,
    MIGRATIONS,
    RECOUNT,
    SCHEMA_VERSION,
    migration_steps,
)
from veil.server.storage.sqlite.writes import RECENT_IDS_LIMIT, SQLiteWrites
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import State, statistic_for

#: problems of the integrity check that ``veil check`` lists at most
CHECK_MAX_PROBLEMS = 20

logger = logging.getLogger("veil.server.storage")


class SQLiteStorage(SQLiteWrites):
    """Reports and aggregates in one SQLite file (WAL, ``synchronous=FULL``).

    Thread-safe: writes are serialized on one connection under a lock, reads use
    pooled connections (WAL readers never block the writer). :attr:`commits` is
    the group commit's lock and queue.
    """

    current_schema = SCHEMA_VERSION

    def __init__(self, path: str | Path, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, recent_ids_limit: int = RECENT_IDS_LIMIT,
                 min_free_bytes: int = MIN_FREE_BYTES, fold_limit: int = tail.FOLD_LIMIT,
                 ) -> None:
        super().__init__(path, create=create, min_free_bytes=min_free_bytes,
                         recent_ids_limit=recent_ids_limit, fold_limit=fold_limit)
        self._use_registry(Registry([], version=1))
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
        writes them) or a plain path; the options are ``recent_ids_limit``,
        ``min_free_bytes`` and ``fold_limit``."""
        return cls(cls._path_of(url), registry, create=create, migrate=migrate, **options)

    @classmethod
    def _existing_file(cls, url: str) -> Path:
        """The path of ``url``; :class:`StorageError` naming the problem if no file is there."""
        path = Path(cls._path_of(url))
        problem = path_problem(path, create=False)
        if problem is not None:
            raise NoStoreError(problem)
        if not path.is_file():
            raise NoStoreError(missing_store(path))
        return path

    @classmethod
    def pending_migrations(cls, url: str) -> list[Migration]:
        """The steps from the file's ``PRAGMA user_version`` to :data:`SCHEMA_VERSION`, read
        without writing (the file is opened read-only)."""
        path = cls._existing_file(url)
        version, tables = read_schema(path)
        if version == 0:  # empty, or another program's: nothing to migrate
            raise NoStoreError(not_veil_sentence(path, tables))
        return cls._steps(path, version, tables)

    @staticmethod
    def _steps(path: Path, version: int, tables: int) -> list[Migration]:
        """The migrations of a file at ``version`` holding ``tables`` tables; a new file (no
        tables) needs none, being created at the current version."""
        if version > SCHEMA_VERSION:
            raise SchemaNewerError(
                f"{path} has schema version {version}, newer than this Veil "
                f"({SCHEMA_VERSION}); upgrade Veil to open it"
            )
        if version == 0:
            if tables:
                raise NoStoreError(not_veil_sentence(path, tables))
            return []
        return migration_steps(version)

    @staticmethod
    def _path_of(url: str) -> str:
        """The file a ``sqlite:///`` URL or a plain path names."""
        path = url.removeprefix("sqlite:///") if "://" in url else url
        if not path or "://" in path:
            raise NoStoreError(f"{url!r} names no file; write sqlite:///veil.db or a plain path")
        return path

    @property
    def location(self) -> str:
        return str(self.path)
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

    def adopt_stored_registry(self, conn: sqlite3.Connection) -> None:
        """Use the registry stored in the file (for migrations that read reports)."""
        stored = sql.stored_registry(conn)
        if stored is None:
            raise StorageError(f"{self.path}: cannot migrate a file without a stored registry")
        self._use_registry(stored)

    def _attach(self, registry: Registry | None) -> Registry:
        """Record ``registry`` in the file (:func:`~veil.server.storage.base.merge_registry`)."""
        with self._write() as conn:
            merged = registry_to_record(
                sql.stored_registry(conn), registry,
                lambda: {row[0] for row in conn.execute(tail.COUNTED_METRICS, (tail.mark(conn),))},
                str(self.path))
            if registry is not None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('registry', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (json.dumps(merged.to_dict(), sort_keys=True),),
                )
            self._use_registry(merged)
            return merged

    # -- reads and maintenance --------------------------------------------------------

    def iter_reports(self, metric: str | None = None, start: str | None = None,
                     end: str | None = None, *, batch_size: int = 262_144,
                     ) -> Iterator[StoredReports]:
        """One scan of ``reports`` in a read transaction (arrival order mixes metrics and
        days: rows wait per (metric, day) until ``batch_size`` of them, or the end)."""
        query = ("SELECT metric, day, id, cohort, payload FROM reports WHERE day BETWEEN ? AND ?"
                 + (" AND metric = ?" if metric is not None else ""))
        parameters = (start or "", end or LAST_DAY, *(() if metric is None else (metric,)))
        waiting: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        with self._unavailable(f"read the reports in {self.path}"), self._reader() as conn, \
                self._snapshot(conn):
            cursor = conn.execute(query, parameters)
            while chunk := cursor.fetchmany(50_000):
                for row in chunk:
                    group = waiting.setdefault((row[0], row[1]), [])
                    group.append(row)
                    if len(group) >= batch_size:
                        yield self._stored_reports(waiting.pop((row[0], row[1])))
        for key in sorted(waiting):
            yield self._stored_reports(waiting[key])

    def _stored_reports(self, rows: list[tuple[Any, ...]]) -> StoredReports:
        """``(metric, day, id, cohort, payload)`` rows of one (metric, day) as arrays."""
        name, day = rows[0][0], rows[0][1]
        statistic = self._metric(name)[1]
        try:
            return StoredReports.of(name, day, [row[2] for row in rows], [row[3] for row in rows],
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
            tail.fold(conn, sql.stored_metrics(conn))  # the day's waiting reports are replaced too
            conn.execute("DELETE FROM folded_aggregates WHERE metric = ? AND day = ?", (metric, day_text))
            conn.executemany(sql.UPSERT, rows)

    def rebuild_aggregates(self) -> int:
        """Recompute, in one transaction, the aggregates of every (metric, day) that has raw
        reports; those of days without any (set from an archive) are kept."""
        with self._unavailable(f"rebuild the aggregates of {self.path}"), self._write() as conn:
            return self.rebuild_in(conn)

    def rebuild_in(self, conn: sqlite3.Connection, *, move_mark: bool = True) -> int:
        """:meth:`rebuild_aggregates` inside a transaction the caller holds: every report is
        counted, so the fold mark moves past the last (migrations from before the mark
        existed pass ``move_mark=False``)."""
        metric_of = sql.stored_metrics(conn)
        if not move_mark:
            return sql.recount(conn, metric_of)
        through = tail.highest_rowid(conn)
        total = sql.recount(conn, metric_of, through)
        tail.set_mark(conn, through)
        return total

    def backup(self, target: str | Path) -> Path:
        """Write a consistent, compacted copy of the database to ``target`` (``VACUUM INTO``).

        Safe while the collector runs: the copy is one read transaction's snapshot.
        """
        return self._vacuum_into(Path(target), self._reader())

    @classmethod
    def backup_as_it_is(cls, url: str, target: str | Path) -> Path:
        """:meth:`backup` of a file at any schema version, without opening it as a store
        (which an older schema refuses until it is migrated): the copy to keep before
        ``veil migrate``. Through a read-only connection; the file is not changed."""
        path = cls._existing_file(url)
        problem = not_veil_problem(path)
        if problem is not None:
            raise NoStoreError(problem)
        target = Path(target)
        conn = read_only(path)
        try:
            return vacuum_into(target, conn, path)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot write the backup {target}: {exc}") from None
        finally:
            conn.close()

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
            if not (isinstance(exc, sql.DamagedRow) or is_damage(exc)):
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
        if version == 0:
            tables = int(conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0])
            raise NoStoreError(not_veil_sentence(path, tables))
        if version != SCHEMA_VERSION:
            raise SchemaNewerError(
                f"{path} has schema version {version} and this Veil checks version "
                f"{SCHEMA_VERSION}: check it with the Veil that wrote it"
            )
        metric_of = sql.stored_metrics(conn)
        conn.execute(RECOUNT)
        # the aggregates count the reports up to the fold mark: those are recounted; the
        # reports past it, which readers count on the spot, must be countable
        reports = sql.recount(conn, metric_of, tail.mark(conn)) + tail.check_tail(conn, metric_of)
        return CheckResult(str(path), mismatches=tuple(sql.differences(conn)), reports=reports,
                           unverified=int(conn.execute(sql.UNVERIFIED).fetchone()[0]),
                           missing_reports=max(
                               int(conn.execute(sql.STORED_IDS).fetchone()[0]) - reports, 0))

    def total_reports(self, metric: str | None = None) -> int:
        with self._unavailable(f"count the reports in {self.path}"), self._reader() as conn:
            if metric is None:
                return int(conn.execute("SELECT count(*) FROM reports").fetchone()[0])
            return int(conn.execute(
                "SELECT count(*) FROM reports WHERE metric = ?", (metric,)).fetchone()[0])

    def daily_reports(self, metric: str | None, start: str | None, end: str | None,
                      ) -> list[DayCount]:
        query = tail.DAILY_REPORTS.format(metric="" if metric is None else "AND metric = ?4")
        with self._unavailable(f"count the reports per day in {self.path}"), \
                self._reader() as conn, self._snapshot(conn):
            parameters = (start or "", end or LAST_DAY, tail.mark(conn),
                          *(() if metric is None else (metric,)))
            rows = conn.execute(query, parameters).fetchall()
        return [DayCount(name, day, int(reports)) for name, day, reports in rows]

    def read_aggregates(self, metric: Metric, start: str | None, end: str | None,
                        ) -> tuple[np.ndarray, list[State]]:
        """The metric's aggregates over the days, and the reports past the fold mark
        counted on the spot, in one read transaction."""
        days = (start or "", end or LAST_DAY)
        with self._unavailable(f"read the counts in {self.path}"):
            with self._reader() as conn, self._snapshot(conn):
                rows = conn.execute(sql.SELECT_AGGREGATES, (metric.name, *days)).fetchall()
                rows += tail.tail_rows(conn, self._metric, metric.name, *days)
            return sql.sum_aggregates(statistic_for(metric.params), metric, rows)

    @staticmethod
    @contextlib.contextmanager
    def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
        """One read transaction on ``conn``: its statements see one state of the file."""
        conn.execute("BEGIN")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
