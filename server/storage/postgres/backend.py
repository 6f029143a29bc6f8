"""Reports and aggregates in PostgreSQL, shared by any number of collectors on any hosts.

Every write is one transaction on a pooled connection (psycopg 3): the reports
are copied into a per-connection staging table (``COPY``), moved into the day's
partition by one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING``
that skips ids stored on the same day (the primary key, exact under
concurrency: a second writer of an id waits for the first and then skips it) or
on the days around it within the replay window, and the accepted reports'
statistics, summed with NumPy, are added into one shard of the aggregate rows.
:meth:`PostgresStorage.insert` returns after the commit, which PostgreSQL has
flushed to its write-ahead log (``synchronous_commit`` as the server sets it:
on by default).

Days are UTC days of the database server's clock, so every collector files a
report under the same day whatever its own clock says. A transaction holds a
shared advisory lock on its day; the first transaction of a collector process on
a new day waits, once, for every transaction still writing the previous day, so
the window check of the new day sees all of them (no transaction starts on the
previous day after midnight by the database's clock).

Any failure of the server or the connection at run time raises
:class:`~veil.server.storage.base.StorageUnavailable` (HTTP 503, retry later);
nothing of the failed call was stored.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import random
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql as psql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from veil.server.storage.base import (
    FIRST_DAY,
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
    aggregate_columns,
    parse_day,
    payload_array,
    registry_to_record,
    sum_aggregate_rows,
    sums_agree,
)
from veil.server.storage.postgres import schema
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import State, Statistic, statistic_for
from veil.shared.wire import Report

#: days around a report's day on which a stored id makes it a duplicate (recorded in the store
#: when it is created: every collector must agree); the day itself is always checked
REPLAY_WINDOW_DAYS = 7
#: connections per process (a collector worker's threads share them)
POOL_SIZE = 8
#: how long a call waits for a pooled connection, or for the server to answer a connect
CONNECT_TIMEOUT_S = 5.0
#: how often a write transaction is retried after PostgreSQL broke a deadlock or a
#: serialization conflict (neither stored anything)
RETRIES = 3
#: days of partitions created ahead of today, so midnight never waits on DDL
DAYS_AHEAD = 2

_EPOCH = dt.date(1970, 1, 1)
_PAYLOAD_DTYPES = {"int": "<i8", "float": "<f8"}

logger = logging.getLogger("veil.server.storage")


def safe_location(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise StorageError(f"cannot read the PostgreSQL URL: {exc}") from None
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host", "")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}"


def _day_number(day: str) -> int:
    return (dt.date.fromisoformat(day) - _EPOCH).days


def _day_text(number: int) -> str:
    return (_EPOCH + dt.timedelta(days=number)).isoformat()


def encode_payload(payload_type: str, stored: Any) -> bytes:
    """A stored payload as the bytes of the ``payload`` column (numbers: 8 bytes, little-endian)."""
    if payload_type == "bytes":
        return bytes(stored)
    return np.array(stored, dtype=_PAYLOAD_DTYPES[payload_type]).tobytes()


def decode_payloads(payload_type: str, blobs: Sequence[bytes]) -> np.ndarray:
    """``payload`` column values as the array :class:`StoredReports` holds."""
    if payload_type == "bytes":
        return payload_array(payload_type, blobs)
    return np.frombuffer(b"".join(blobs), dtype=_PAYLOAD_DTYPES[payload_type]).astype(
        np.int64 if payload_type == "int" else np.float64)


class PostgresStorage(Storage):
    """Reports and aggregates in a PostgreSQL database (``postgresql://user@host/dbname``).

    Thread-safe (a connection pool); any number of processes on any hosts may
    open the same database. Options: ``replay_window_days`` (recorded when the
    store is created), ``pool_size``.
    """

    current_schema = schema.SCHEMA_VERSION

    @classmethod
    def describe(cls, url: str) -> str:
        return safe_location(url)

    def __init__(self, url: str, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, replay_window_days: int = REPLAY_WINDOW_DAYS,
                 pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self._location = safe_location(url)
        for name, value, least in (("replay_window_days", replay_window_days, 1),
                                   ("pool_size", pool_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise StorageError(f"{name} must be an integer >= {least}; got {value!r}")
        self._use_registry(Registry([], version=1))
        self._partitions: set[str] = set()
        self._sealed: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False,
                                    timeout=CONNECT_TIMEOUT_S, check=ConnectionPool.check_connection,
                                    configure=self._configure, name="veil",
                                    kwargs={"autocommit": True,
                                            "connect_timeout": int(CONNECT_TIMEOUT_S)})
        try:
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout:
            self._pool.close()
            raise StorageUnavailable(f"cannot connect to {self._location} within "
                                     f"{CONNECT_TIMEOUT_S:g} s: is PostgreSQL running, and does "
                                     "the database exist?") from None
        try:
            with self._unavailable(f"open {self._location}"):
                self.migrated = self._prepare(create, migrate, replay_window_days)
                self._attach(registry)
                self._ensure_partitions(self._today())
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, url: str, registry: Registry | None = None, *, create: bool = False,
             migrate: bool = False, **options: Any) -> PostgresStorage:
        """Open ``postgresql://user[:password]@host[:port]/dbname`` (libpq's URL form; the
        database must exist); the options are ``replay_window_days`` and ``pool_size``."""
        return cls(url, registry, create=create, migrate=migrate, **options)

    @staticmethod
    def _configure(conn: psycopg.Connection[Any]) -> None:
        """Each new pooled connection: its staging tables."""
        conn.execute(schema.STAGING)
        conn.execute(schema.AGGREGATE_STAGING)

    # -- schema and registry -------------------------------------------------------------

    @classmethod
    def _version(cls, conn: psycopg.Connection[Any], location: str) -> int | None:
        """The store's schema version (``None``: the database holds no Veil store)."""
        exists = conn.execute("SELECT to_regclass('veil_meta') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT value FROM veil_meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise StorageError(f"{location} has a veil_meta table without a schema version: "
                               "it was not written by Veil")
        return int(row[0])

    @classmethod
    def _check_version(cls, version: int, location: str) -> None:
        if version > schema.SCHEMA_VERSION:
            raise StorageError(
                f"{location} has schema version {version}, newer than this Veil's "
                f"({schema.SCHEMA_VERSION}): use the Veil that wrote it, or a newer one"
            )

    def _prepare(self, create: bool, migrate: bool, replay_window_days: int,
                 ) -> tuple[Migration, ...]:
        """Create the tables of a new store (one creator at a time), or bring an existing
        store to :data:`~.schema.SCHEMA_VERSION` (only if ``migrate``, else
        :class:`SchemaOutdatedError`), each step logged; read the replay window it records.
        Returns the steps applied."""
        steps: list[Migration] = []
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_SCHEMA,))
            version = self._version(conn, self._location)
            if version is None:
                if not create:
                    raise StorageError(f"no Veil store in {self._location}; start the collector "
                                       "with this --db first")
                for statement in schema.CREATE:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO veil_meta (key, value) VALUES ('schema_version', %s), "
                    "('replay_window_days', %s), ('retained_from', '0001-01-01')",
                    (str(schema.SCHEMA_VERSION), str(replay_window_days)))
            else:
                self._check_version(version, self._location)
                steps = schema.migration_steps(version)
                if steps and not migrate:
                    raise SchemaOutdatedError(self._location, version, schema.SCHEMA_VERSION)
                for step in steps:
                    logger.info("migrating %s: %s", self._location, step)
                    schema.MIGRATIONS[step.version](conn)
                if steps:
                    conn.execute("UPDATE veil_meta SET value = %s WHERE key = 'schema_version'",
                                 (str(schema.SCHEMA_VERSION),))
            self.replay_window_days = int(self._meta(conn, "replay_window_days"))
            self.retained_from = self._meta(conn, "retained_from")
        return tuple(steps)

    @staticmethod
    def _meta(conn: psycopg.Connection[Any], key: str) -> str:
        row = conn.execute("SELECT value FROM veil_meta WHERE key = %s", (key,)).fetchone()
        if row is None:
            raise StorageError(f"veil_meta lacks {key!r}: the store was not written by Veil")
        return str(row[0])

    @classmethod
    def pending_migrations(cls, url: str) -> list[Migration]:
        location = safe_location(url)
        with cls._connect(url) as conn:
            version = cls._version(conn, location)
        if version is None:
            raise StorageError(f"no Veil store in {location}")
        cls._check_version(version, location)
        return schema.migration_steps(version)

    @staticmethod
    @contextlib.contextmanager
    def _connect(url: str) -> Iterator[psycopg.Connection[Any]]:
        """One connection outside any pool (checks and migrations)."""
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S))
        except psycopg.Error as exc:
            raise StorageUnavailable(f"cannot connect to {safe_location(url)}: "
                                     f"{' '.join(str(exc).split())}") from None
        with conn:
            yield conn

    def _attach(self, registry: Registry | None) -> Registry:
        """Record ``registry`` (:func:`~veil.server.storage.base.merge_registry`)."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_SCHEMA,))
            merged = registry_to_record(
                self._stored_registry(conn), registry,
                lambda: {row[0] for row in
                         conn.execute("SELECT DISTINCT metric FROM veil_aggregates")},
                self._location)
            if registry is not None:
                conn.execute(
                    "INSERT INTO veil_meta (key, value) VALUES ('registry', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (json.dumps(merged.to_dict(), sort_keys=True),))
            self._use_registry(merged)
            return merged

    @staticmethod
    def _stored_registry(conn: psycopg.Connection[Any]) -> Registry | None:
        row = conn.execute("SELECT value FROM veil_meta WHERE key = 'registry'").fetchone()
        if row is None:
            return None
        try:
            return Registry.from_dict(json.loads(row[0]))
        except (TypeError, ValueError) as exc:
            raise StorageError(f"the registry stored in veil_meta cannot be read ({exc})") from None

    @property
    def location(self) -> str:
        return self._location

    # -- partitions and days -------------------------------------------------------------

    def _today(self) -> str:
        """Today's UTC day by the database server's clock."""
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT to_char(statement_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD')").fetchone()
        return str(row[0]) if row else ""

    def _ensure_partitions(self, day: str) -> None:
        """Create the partitions of ``day`` and of :data:`DAYS_AHEAD` days after it, each in
        its own short transaction (creating one locks the parent table)."""
        first = _day_number(day)
        for number in range(first, first + DAYS_AHEAD + 1):
            name = _day_text(number)
            if name in self._partitions:
                continue
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_PARTITIONS,))
                conn.execute(psql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} PARTITION OF veil_reports "
                    "FOR VALUES FROM ({}) TO ({})").format(
                        psql.Identifier(schema.partition_name(name)), psql.Literal(name),
                        psql.Literal(_day_text(number + 1))))
            self._partitions.add(name)

    def partitions(self) -> list[str]:
        """The days that have a partition of raw reports, oldest first."""
        with self._unavailable(f"list the partitions of {self._location}"), \
                self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'veil_reports'"
            ).fetchall()
        prefix = len(schema.partition_name(""))
        days = [f"{r[0][prefix:prefix + 4]}-{r[0][prefix + 4:prefix + 6]}-{r[0][prefix + 6:]}"
                for r in rows]
        return sorted(days)

    def drop_days_before(self, day: dt.date | str) -> list[str]:
        """Retention: drop the raw reports of every day before ``day`` (whole partitions;
        their aggregates stay, so counts are unchanged) and refuse reports for those days
        from now on. Returns the days dropped."""
        cutoff = str(parse_day(day, "day"))
        dropped = []
        with self._unavailable(f"drop old days from {self._location}"):
            for name in self.partitions():
                if name >= cutoff:
                    continue
                with self._pool.connection() as conn, conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_PARTITIONS,))
                    conn.execute(psql.SQL("DROP TABLE IF EXISTS {}").format(
                        psql.Identifier(schema.partition_name(name))))
                self._partitions.discard(name)
                dropped.append(name)
            with self._pool.connection() as conn:
                conn.execute("UPDATE veil_meta SET value = greatest(value, %s) "
                             "WHERE key = 'retained_from'", (cutoff,))
                self.retained_from = self._meta(conn, "retained_from")
        return dropped

    # -- writes --------------------------------------------------------------------------

    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None, *,
               cap: DailyCap | None = None) -> InsertResult:
        """Store validated reports under ``day`` (default: today by the database's clock, UTC)
        and add their statistics to the aggregates, in one transaction; durable on return.

        A report whose id is stored on the same day, or on a day within
        ``replay_window_days`` of it, or earlier in the call, is a duplicate:
        acknowledged, not counted again. A day before the retention cutoff is refused.
        With a ``cap``, the new reports are counted under it in that transaction, or the
        transaction is rolled back (:class:`~veil.server.storage.base.DailyCapReached`).
        """
        day_text = parse_day(day, "day")
        if day_text is not None and day_text < self.retained_from:
            raise StorageError(
                f"day {day_text} is outside the accepted window: days before {self.retained_from} "
                "were dropped by retention (veil retention), and their reports are refused")
        first: dict[str, _Row] = {}
        for report in reports:
            metric, statistic = self._metric(report.metric)
            stored = statistic.stored_payload(metric.params, report.payload, report.value)
            if report.id not in first:
                first[report.id] = (report.id, report.metric, report.cohort,
                                    encode_payload(statistic.payload_type, stored).hex(), stored)
        if not first:
            return InsertResult(0, 0)
        rows = sorted(first.values())  # one order for every writer: no deadlocks on ids
        for attempt in range(RETRIES + 1):
            try:
                accepted = self._insert_once(rows, day_text, cap)
                break
            except _MissingPartition as missing:
                with self._unavailable(f"create the partition of {missing.day}"):
                    self._ensure_partitions(missing.day)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if attempt == RETRIES:
                    raise StorageUnavailable("cannot store the reports: PostgreSQL kept breaking "
                                             "conflicts with other writers; retry") from None
            except (psycopg.Error, PoolTimeout) as exc:
                raise self._failure("store the reports", exc) from exc
        else:
            raise StorageUnavailable("cannot store the reports: their day's partition keeps "
                                     "disappearing (is retention dropping today?); retry")
        return InsertResult(accepted, len(reports) - accepted)

    def _insert_once(self, rows: list[_Row], day: str | None, cap: DailyCap | None) -> int:
        """One attempt of :meth:`insert`'s transaction; the number of reports accepted."""
        if self._closed:
            raise StorageUnavailable("the storage is closed")
        sealed: int | None = None  # the day this transaction seals, once it commits
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            # the day by the server's clock, and the lock that holds it open
            found = cursor.execute(schema.LOCK_TODAY if day is None else schema.LOCK_GIVEN_DAY,
                                   {"lock": schema.LOCK_DAY, "day": day}).fetchone()
            day = str(found[0]) if found else ""
            number = _day_number(day)
            if day not in self._partitions:
                raise _MissingPartition(day)
            if number not in self._sealed:
                # wait for every transaction still writing the previous day (once a day per
                # process), so the window check below sees their ids and no writer adds to
                # that day's shards any more; then fold them into one row per cohort
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (schema.LOCK_DAY, number - 1))
                cursor.execute(schema.FOLD_DAY, {"day": _day_text(number - 1),
                                                 "metrics": list(self.registry)})
                sealed = number
            # COPY's text format, written directly: ids and payloads are hex already
            with cursor.copy("COPY veil_staging (id, metric, cohort, payload) FROM STDIN") as copy:
                copy.write("".join([f"\\\\x{row[0]}\t{row[1]}\t{row[2]}\t\\\\x{row[3]}\n"
                                    for row in rows]))
            window = self.replay_window_days - 1
            cursor.execute(
                "INSERT INTO veil_reports (day, id, metric, cohort, payload) "
                "SELECT %(day)s, s.id, s.metric, s.cohort, s.payload FROM veil_staging s "
                # two ranges, not "<> day": partition pruning then leaves the day itself out
                + ("WHERE NOT EXISTS (SELECT 1 FROM veil_reports r WHERE r.id = s.id AND "
                   "(r.day BETWEEN %(first)s AND %(before)s OR r.day BETWEEN %(after)s AND %(last)s)) "
                   if window else "")
                + "ORDER BY s.id ON CONFLICT (day, id) DO NOTHING RETURNING encode(id, 'hex')",
                {"day": day, "first": _day_text(number - window), "before": _day_text(number - 1),
                 "after": _day_text(number + 1), "last": _day_text(number + window)})
            new = {record[0] for record in cursor.fetchall()}
            fresh = [row for row in rows if row[0] in new]
            if cap is not None and fresh:
                self._charge_cap(cursor, cap, day, len(fresh))
            aggregates = self._aggregate_rows(fresh, day, random.randrange(schema.SHARDS))
            if aggregates:
                with cursor.copy(schema.COPY_AGGREGATES) as copy:
                    copy.write("".join(aggregates))
                cursor.execute(schema.UPSERT_STAGED)
        if sealed is not None:  # a rolled-back transaction folded nothing: the next one will
            self._sealed.add(sealed)
        return len(fresh)

    @staticmethod
    def _charge_cap(cursor: psycopg.Cursor[Any], cap: DailyCap, day: str, reports: int) -> None:
        """Count ``reports`` new reports under ``cap`` and ``day`` in the write transaction of
        ``cursor``; :class:`DailyCapReached` (which rolls it back) if they exceed the cap. The
        count's row stays locked until the commit: the next writer of the key, on any
        collector, waits for it and then adds to what it committed."""
        found = cursor.execute(schema.CHARGE_CAP, {"key": cap.key, "day": day,
                                                   "reports": reports}).fetchone()
        counted = int(found[0]) if found else reports
        if counted > cap.limit:
            left = cursor.execute(schema.SECONDS_LEFT, {"day": day}).fetchone()
            raise DailyCapReached(cap.limit, day, counted - reports,
                                  max(float(left[0]) if left else 0.0, 1.0))

    def _aggregate_rows(self, rows: Sequence[_Row], day: str, shard: int) -> list[str]:
        """``rows``' statistics per (metric, cohort) as lines of COPY's text format."""
        by_metric: dict[str, list[_Row]] = {}
        for row in rows:
            by_metric.setdefault(row[1], []).append(row)
        out = []
        for name in sorted(by_metric):
            group = by_metric[name]
            metric, statistic = self._metric(name)
            cohorts = np.fromiter((row[2] for row in group), dtype=np.int64, count=len(group))
            for cohort, reports, state in statistic.accumulate(metric.params, cohorts,
                                                               [row[4] for row in group]):
                out.append(_copy_line(self._aggregate_row(name, day, cohort, shard, reports,
                                                          statistic, state)))
        return out

    @staticmethod
    def _aggregate_row(name: str, day: str, cohort: int, shard: int, reports: int,
                       statistic: Statistic, state: State) -> tuple[Any, ...]:
        """The row ``(metric, day, cohort, shard, reports, *COLUMNS)`` of one cohort's state."""
        return (name, day, int(cohort), shard, int(reports),
                *aggregate_columns(statistic, state, lambda v: v.astype(np.int64)))

    def _write_aggregates(self, cursor: psycopg.Cursor[Any], rows: list[tuple[Any, ...]]) -> None:
        """Add aggregate rows (``_aggregate_row``'s) into the table, in one statement."""
        if rows:
            # the staging table empties at commit: a transaction that writes several times
            # (a rebuild) empties it itself, or would add earlier rows again
            cursor.execute("DELETE FROM veil_aggregate_staging")
            with cursor.copy(schema.COPY_AGGREGATES) as copy:
                copy.write("".join(_copy_line(row) for row in rows))
            cursor.execute(schema.UPSERT_STAGED)

    def replace_aggregates(self, metric: str, day: str, reports: np.ndarray,
                           states: Sequence[State]) -> None:
        day_text = str(parse_day(day, "day"))
        stored, statistic = self._metric(metric)
        rows = [self._aggregate_row(metric, day_text, c, 0, int(reports[c]), statistic, states[c])
                for c in range(stored.params.cohorts) if reports[c]]
        with self._unavailable(f"write the aggregates of {metric!r} on {day_text}"), \
                self._pool.connection() as conn, conn.transaction():
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
                rows = [self._aggregate_row(name, day, int(c), 0, int(reports[c]), statistic,
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
                yield StoredReports(
                    name, day,
                    np.frombuffer(b"".join(r[0] for r in rows), dtype=np.uint8).reshape(-1, 16),
                    np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
                    decode_payloads(statistic.payload_type, [r[2] for r in rows]))

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

    # -- reads ---------------------------------------------------------------------------

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

    # -- health, checks, failures ----------------------------------------------------------

    def ping(self) -> None:
        """Readiness: the server answers, this process may write, and the store is open."""
        if self._closed:
            raise StorageUnavailable("the storage is closed")
        with self._unavailable(f"reach {self._location}"), self._pool.connection() as conn:
            conn.execute("SELECT 1 FROM veil_meta LIMIT 1").fetchall()
            read_only = conn.execute("SHOW transaction_read_only").fetchone()
        if read_only and read_only[0] == "on":
            raise StorageUnavailable(f"{self._location} is read-only (a standby?)")

    @classmethod
    def check(cls, url: str) -> CheckResult:
        """Every aggregate of a (metric, day) that has raw reports against a recount of them,
        in one repeatable-read snapshot (collectors keep writing meanwhile)."""
        location = safe_location(url)
        with cls._connect(url) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            version = cls._version(conn, location)
            if version is None:
                raise StorageError(f"no Veil store in {location}")
            cls._check_version(version, location)
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
                    differing += [field.column for field in statistic.fields if not _equal(
                        stored_states[cohort][field.name], states[cohort][field.name],
                        int(reports[cohort]))]
                    if differing:
                        mismatches.append(f"{where}: {', '.join(differing)} differ from a "
                                          "recount of the reports")
        return CheckResult(location, mismatches=tuple(mismatches), reports=total, integrity=None)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.close()

    def _failure(self, action: str, exc: BaseException) -> StorageUnavailable:
        return StorageUnavailable(f"cannot {action} in {self._location}: "
                                  f"{' '.join(str(exc).split())}")

    @contextlib.contextmanager
    def _unavailable(self, action: str) -> Iterator[None]:
        """PostgreSQL's and the pool's run-time failures as :class:`StorageUnavailable`."""
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._failure(action, exc) from exc


#: a report to store: hex id, metric, cohort, hex payload column, stored payload
_Row = tuple[str, str, int, str, Any]


def _copy_line(row: Sequence[Any]) -> str:
    """One line of COPY's text format: counters as array literals, ``None`` as NULL."""
    fields = []
    for value in row:
        if value is None:
            fields.append("\\N")
        elif isinstance(value, np.ndarray):
            fields.append("{" + ",".join(map(str, value.tolist())) + "}")
        else:
            fields.append(str(value))
    return "\t".join(fields) + "\n"


class _MissingPartition(Exception):
    """The day a write transaction drew has no partition yet (it rolls back; the caller
    creates it and tries again)."""

    def __init__(self, day: str) -> None:
        super().__init__(day)
        self.day = day


def _equal(stored: Any, recounted: Any, reports: int) -> bool:
    """Whether a stored field equals its recount (sums of reals up to the order of addition)."""
    if isinstance(stored, np.ndarray) or isinstance(recounted, np.ndarray):
        return bool(np.array_equal(np.asarray(stored, dtype=np.uint64),
                                   np.asarray(recounted, dtype=np.uint64)))
    if isinstance(stored, float) or isinstance(recounted, float):
        return sums_agree(stored, recounted, reports)
    return bool(stored == recounted)


#: PostgreSQL's binary form of a one-dimensional bigint array: a 20-byte header (dimensions,
#: null flag, element type, length, lower bound), then per element its length and its value
_ARRAY_HEADER = 20
_ARRAY_ELEMENT = np.dtype([("length", ">i4"), ("value", ">i8")])


def array_counters(rows: Sequence[Sequence[Any]], at: int, length: int) -> np.ndarray:
    """Column ``at`` of aggregate rows (``array_send`` of ``length`` counters each) as a
    ``(len(rows), length)`` uint64 array; :class:`StorageError` for a malformed one."""
    blobs = [bytes(row[at])[_ARRAY_HEADER:] for row in rows]
    if any(len(blob) != length * _ARRAY_ELEMENT.itemsize for blob in blobs):
        raise StorageError(f"an aggregate row holds a counter array that is not {length} long")
    elements = np.frombuffer(b"".join(blobs), dtype=_ARRAY_ELEMENT)
    return elements["value"].astype(np.uint64).reshape(len(rows), length)


