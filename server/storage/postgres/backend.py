"""Reports and aggregates in PostgreSQL, shared by any number of collectors on any hosts.

:class:`PostgresStorage` is built in three layers, one job each: the database, its
connection pool, the store's schema and registry, readiness
(:mod:`~veil.server.storage.postgres.database`); the write path, with the day partitions,
inserts and retention (:mod:`~veil.server.storage.postgres.writes`); and here, reads, the
aggregates' rebuild and :meth:`PostgresStorage.check` (``veil check``). Tables and SQL are
in :mod:`~veil.server.storage.postgres.schema`, the rows' formats in
:mod:`~veil.server.storage.postgres.rows`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from veil.server.storage.base import (
    FIRST_DAY,
    LAST_DAY,
    CheckResult,
    DayCount,
    StoredReports,
    parse_day,
    sum_aggregate_rows,
)
from veil.server.storage.errors import StorageError
from veil.server.storage.postgres import schema
from veil.server.storage.postgres.database import safe_location
from veil.server.storage.postgres.rows import (
    aggregate_row,
    array_counters,
    day_number,
    decode_payloads,
    fields_equal,
)
from veil.server.storage.postgres.writes import PostgresWrites
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import State, Statistic, statistic_for


class PostgresStorage(PostgresWrites):
    """Reports and aggregates in a PostgreSQL database (``postgresql://user@host/dbname``).

    Thread-safe (a connection pool); any number of processes on any hosts may
    open the same database. Options: ``replay_window_days`` (recorded when the
    store is created), ``pool_size``.
    """

    current_schema = schema.SCHEMA_VERSION

    @classmethod
    def open(cls, url: str, registry: Registry | None = None, *, create: bool = False,
             migrate: bool = False, **options: Any) -> PostgresStorage:
        """Open ``postgresql://user[:password]@host[:port]/dbname`` (libpq's URL form; the
        database must exist); the options are ``replay_window_days`` and ``pool_size``."""
        return cls(url, registry, create=create, migrate=migrate, **options)

    # -- reads and maintenance -----------------------------------------------------------

    def replace_aggregates(self, metric: str, day: str, reports: np.ndarray,
                           states: Sequence[State]) -> None:
        day_text = str(parse_day(day, "day"))
        stored, statistic = self._metric(metric)
        rows = [aggregate_row(metric, day_text, c, 0, int(reports[c]), statistic, states[c])
                for c in range(stored.params.cohorts) if reports[c]]
        with self._unavailable(f"write the aggregates of {metric!r} on {day_text}"), \
                self._pool.connection() as conn, conn.transaction():
            # the day's lock, as the first write of the next day takes it to fold the day's
            # shards: a fold not yet committed would otherwise survive the replacement and
            # add the day's reports to the archive's counts
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                         (schema.LOCK_DAY, day_number(day_text)))
            conn.execute("DELETE FROM veil_aggregates WHERE metric = %s AND day = %s",
                         (metric, day_text))
            with conn.cursor() as cursor:
                self._write_aggregates(cursor, rows)

    def rebuild_aggregates(self) -> int:
        """Recount the aggregates of every (metric, day) that has raw reports, in one
        transaction. Collectors may keep writing: their transactions wait for this one and
        then add their reports on top of the recount. Days whose raw reports retention
        dropped keep their aggregates."""
        with self._unavailable(f"rebuild the aggregates of {self._location}"), \
                self._pool.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE veil_aggregates IN EXCLUSIVE MODE")
            total = 0
            for name, day in self._raw_days(conn):
                conn.execute("DELETE FROM veil_aggregates WHERE metric = %s AND day = %s",
                             (name, day))
                metric, statistic = self._metric(name)
                reports, states = self._recount(conn, metric, day)
                total += int(reports.sum())
                rows = [aggregate_row(name, day, int(c), 0, int(reports[c]), statistic,
                                            states[c]) for c in np.flatnonzero(reports)]
                with conn.cursor() as cursor:
                    self._write_aggregates(cursor, rows)
            return total

    @staticmethod
    def _raw_days(conn: psycopg.Connection[Any], metric: str | None = None,
                  start: str | None = None, end: str | None = None) -> list[tuple[str, str]]:
        """Every (metric, day) that has raw reports, of ``metric`` (all when None) on the
        days ``start``..``end``: the day range prunes the table's day partitions."""
        return [(str(r[0]), str(r[1])) for r in conn.execute(
            "SELECT DISTINCT metric, to_char(day, 'YYYY-MM-DD') FROM veil_reports "
            "WHERE day BETWEEN %s AND %s AND (%s::text IS NULL OR metric = %s) ORDER BY 1, 2",
            (start or FIRST_DAY, end or LAST_DAY, metric, metric))]

    @classmethod
    def _recount(cls, conn: psycopg.Connection[Any], metric: Metric, day: str,
                 ) -> tuple[np.ndarray, list[State]]:
        """Reports per cohort and states of ``metric`` on ``day``, from the raw reports."""
        statistic = statistic_for(metric.params)
        cohorts = metric.params.cohorts
        reports = np.zeros(cohorts, dtype=np.int64)
        states = [statistic.zero(metric.params) for _ in range(cohorts)]
        for chunk in cls._chunks(conn, metric.name, day, 262_144, statistic):
            for cohort, count, state in statistic.accumulate_arrays(
                    metric.params, chunk.cohorts, chunk.payloads):
                reports[cohort] += count
                states[cohort] = statistic.merge(states[cohort], state)
        return reports, states

    @staticmethod
    def _chunks(conn: psycopg.Connection[Any], name: str, day: str, batch_size: int,
                statistic: Statistic) -> Iterator[StoredReports]:
        """The raw reports of ``name`` on ``day`` through a server-side cursor."""
        with conn.cursor(name=f"veil_read_{random.getrandbits(32)}") as cursor:
            cursor.execute("SELECT id, cohort, payload FROM veil_reports "
                           "WHERE day = %s AND metric = %s", (day, name))
            while rows := cursor.fetchmany(batch_size):
                yield StoredReports.of(name, day, [r[0] for r in rows], [r[1] for r in rows],
                                       decode_payloads(statistic.payload_type, [r[2] for r in rows],
                                                       f" (metric {name!r}, {day})"))

    def iter_reports(self, metric: str | None = None, start: str | None = None,
                     end: str | None = None, *, batch_size: int = 262_144,
                     ) -> Iterator[StoredReports]:
        """Per (metric, day) with raw reports, in order, through a server-side cursor in one
        repeatable-read transaction (a consistent snapshot while collectors write)."""
        with self._unavailable(f"read the reports in {self._location}"), \
                self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            for name, day in self._raw_days(conn, metric, start, end):
                yield from self._chunks(conn, name, day, batch_size, self._metric(name)[1])

    def backup(self, target: str | Path) -> Path:
        raise StorageError(
            f"veil backup writes SQLite files; back up {self._location} with PostgreSQL's own "
            f"tools: pg_dump --format=custom --file={target} '<the database URL>', or continuous "
            "archiving (docs/operations.md, Scaling out)")

    def total_reports(self, metric: str | None = None) -> int:
        query = "SELECT count(*) FROM veil_reports" + (" WHERE metric = %s" if metric else "")
        with self._unavailable(f"count the reports in {self._location}"), \
                self._pool.connection() as conn:
            row = conn.execute(query, (metric,) if metric else ()).fetchone()
        return int(row[0]) if row else 0

    def daily_reports(self, metric: str | None, start: str | None, end: str | None,
                      ) -> list[DayCount]:
        query = ("SELECT metric, to_char(day, 'YYYY-MM-DD'), sum(reports) FROM veil_aggregates "
                 "WHERE day BETWEEN %s AND %s " + ("AND metric = %s " if metric else "")
                 + "GROUP BY metric, day ORDER BY metric, day")
        parameters = (start or FIRST_DAY, end or LAST_DAY, *((metric,) if metric else ()))
        with self._unavailable(f"count the reports per day in {self._location}"), \
                self._pool.connection() as conn:
            rows = conn.execute(query, parameters).fetchall()
        return [DayCount(name, day, int(reports)) for name, day, reports in rows]

    def read_aggregates(self, metric: Metric, start: str | None, end: str | None,
                        ) -> tuple[np.ndarray, list[State]]:
        with self._unavailable(f"read the counts in {self._location}"), \
                self._pool.connection() as conn, conn.cursor(binary=True) as cursor:
            # binary results: counter arrays arrive as bytes, not as hex text
            rows = cursor.execute(schema.SELECT_AGGREGATES,
                                  (metric.name, start or FIRST_DAY, end or LAST_DAY)).fetchall()
        return sum_aggregate_rows(statistic_for(metric.params), metric, rows, array_counters)

    # -- checks ----------------------------------------------------------------------------

    @classmethod
    def check(cls, url: str) -> CheckResult:
        """Every aggregate of a (metric, day) that has raw reports against a recount of them,
        in one repeatable-read snapshot (collectors keep writing meanwhile)."""
        location = safe_location(url)
        with cls._connect(url) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cls._existing_version(conn, location)
            registry = cls._stored_registry(conn)

            mismatches = []
            total = 0
            for name, day in cls._raw_days(conn):
                if registry is None or name not in registry:
                    raise StorageError(f"a report of metric {name!r}, which the registry lacks")
                metric = registry[name]
                statistic = statistic_for(metric.params)
                reports, states = cls._recount(conn, metric, day)
                total += int(reports.sum())
                stored_reports, stored_states = sum_aggregate_rows(
                    statistic, metric, conn.execute(
                        schema.SELECT_AGGREGATES, (name, day, day), binary=True).fetchall(),
                    array_counters)
                for cohort in range(metric.params.cohorts):
                    where = f"metric {name!r}, day {day}, cohort {cohort}"
                    differing = [] if stored_reports[cohort] == reports[cohort] else ["reports"]
                    differing += [field.column for field in statistic.fields if not fields_equal(
                        stored_states[cohort][field.name], states[cohort][field.name],
                        int(reports[cohort]))]
                    if differing:
                        mismatches.append(f"{where}: {', '.join(differing)} differ from a "
                                          "recount of the reports")
        return CheckResult(location, mismatches=tuple(mismatches), reports=total, integrity=None)
