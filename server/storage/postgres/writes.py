"""The write path of the PostgreSQL storage: day partitions, inserts and retention.

Every write is one transaction on a pooled connection: the reports are copied into a
per-connection staging table (``COPY``), moved into the day's partition by one
``INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING`` that skips ids stored on the
same day (the primary key, exact under concurrency: a second writer of an id waits for
the first and then skips it) or on the days around it within the replay window, and the
accepted reports' statistics, summed with NumPy, are added into one shard of the
aggregate rows. :meth:`PostgresWrites.insert` returns after the commit, which PostgreSQL
has flushed to its write-ahead log (``synchronous_commit`` as the server sets it: on by
default).

Days are UTC days of the database server's clock, so every collector files a
report under the same day whatever its own clock says. A transaction holds a
shared advisory lock on its day; the first transaction of a collector process on
a new day waits, once, for every transaction still writing the previous day, so
the window check of the new day sees all of them (no transaction starts on the
previous day after midnight by the database's clock).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql as psql
from psycopg_pool import PoolTimeout

from veil.server.storage.base import DailyCap, DailyCapReached, InsertResult, parse_day
from veil.server.storage.errors import StorageError, StorageUnavailable
from veil.server.storage.postgres import schema
from veil.server.storage.postgres.database import POOL_SIZE, REPLAY_WINDOW_DAYS, PostgresDatabase
from veil.server.storage.postgres.rows import (
    Row,
    aggregate_row,
    copy_line,
    day_number,
    day_text,
    encode_payload,
)
from veil.shared.registry import Registry
from veil.shared.wire import Report

logger = logging.getLogger("veil.server.storage")

#: how often a write transaction is retried after PostgreSQL broke a deadlock or a
#: serialization conflict (neither stored anything)
RETRIES = 3
#: days of partitions after today a store creates when it opens; a day's first write creates
#: those of the :data:`DAYS_AHEAD` + 1 days after it, so midnight never waits on DDL
DAYS_AHEAD = 2
#: milliseconds DDL that locks ``veil_reports`` (a partition created ahead of its day, a day
#: dropped by retention) waits for a reader before it gives up: inserts queue behind it
DDL_LOCK_TIMEOUT_MS = 1000


class MissingPartition(Exception):
    """The day a write transaction drew has no partition yet (it rolls back; the caller
    creates it and tries again)."""

    def __init__(self, day: str) -> None:
        super().__init__(day)
        self.day = day


class PostgresWrites(PostgresDatabase):
    """:class:`~.database.PostgresDatabase` with the write path: the day partitions (created
    ahead, dropped by retention) and :meth:`insert`."""

    def __init__(self, url: str, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, replay_window_days: int = REPLAY_WINDOW_DAYS,
                 pool_size: int = POOL_SIZE) -> None:
        self._partitions: set[str] = set()
        self._sealed: set[int] = set()
        super().__init__(url, registry, create=create, migrate=migrate,
                         replay_window_days=replay_window_days, pool_size=pool_size)
        try:
            with self._unavailable(f"open {self._location}"):
                today = self.today()
                self._ensure_partition(today)
            self._prepare_ahead(today, DAYS_AHEAD)
        except BaseException:
            self.close()
            raise

    # -- partitions and days -------------------------------------------------------------

    def today(self) -> str:
        """Today's UTC day by the database server's clock."""
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT to_char(statement_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD')").fetchone()
        return str(row[0]) if row else ""

    def _ensure_partition(self, day: str, *, wait: bool = True) -> None:
        """Create the partition of ``day`` in a short transaction of its own (creating one
        locks the parent table). A partition that exists is only noted: ``to_regclass`` reads
        the catalog without a lock, so processes that find it waste no lock wait. Without
        ``wait``, the creation gives up (``LockNotAvailable``) after
        :data:`DDL_LOCK_TIMEOUT_MS` of waiting for the partitions' lock or the table, rather
        than hold up the inserts that queue behind it while a long reader (``veil check``,
        an archive) holds the table."""
        if day in self._partitions:
            return
        name = schema.partition_name(day)
        with self._pool.connection() as conn, conn.transaction():
            found = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
            if found is None or found[0] is None:
                if not wait:
                    conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_PARTITIONS,))
                conn.execute(psql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} PARTITION OF veil_reports "
                    "FOR VALUES FROM ({}) TO ({})").format(
                        psql.Identifier(name), psql.Literal(day),
                        psql.Literal(day_text(day_number(day) + 1))))
        self._partitions.add(day)

    def _prepare_ahead(self, day: str, days: int = DAYS_AHEAD + 1) -> None:
        """Create the partitions of the ``days`` days after ``day`` while they are not needed
        yet, giving up on a table a long reader holds (logged; tried again at the next day's
        first write): the day that first needs a partition then no longer waits for one
        behind that reader (uploads held for as long as a ``veil check`` ran). Called when a
        store opens and once a day, after the day's first write."""
        try:
            for number in range(day_number(day) + 1, day_number(day) + days + 1):
                self._ensure_partition(day_text(number), wait=False)
        except (psycopg.Error, PoolTimeout) as exc:
            logger.info("creating the partitions of the days after %s waits for a later day "
                        "(%s)", day, type(exc).__name__)

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

    def _retain_from(self, day: str) -> None:
        """Refuse reports of the days before ``day`` from now on (retention dropped them)."""
        with self._pool.connection() as conn:
            conn.execute("UPDATE veil_meta SET value = greatest(value, %s) "
                         "WHERE key = 'retained_from'", (day,))
            self.retained_from = self._meta(conn, "retained_from")

    def drop_days_before(self, day: dt.date | str) -> list[str]:
        """Retention: drop the raw reports of every day before ``day`` (whole partitions;
        their aggregates stay, so counts are unchanged) and refuse reports for those days
        from now on. Returns the days dropped. A ``day`` inside the replay window (today by
        the database's clock and the ``replay_window_days - 1`` days before) is refused with
        :class:`StorageError`; so is a partition a reader holds for longer than
        :data:`DDL_LOCK_TIMEOUT_MS`, after the days before it were dropped (and refused)."""
        cutoff = str(parse_day(day, "day"))
        dropped: list[str] = []
        with self._unavailable(f"drop old days from {self._location}"):
            today = self.today()
            latest = day_text(day_number(today) - (self.replay_window_days - 1))
            if cutoff > latest:
                # a report of a dropped day resent within the window would count again,
                # and today's partition, gone, would refuse every upload
                raise StorageError(
                    f"dropping the raw reports of the days before {cutoff} would drop days "
                    f"within the {self.replay_window_days}-day replay window (today is {today} "
                    f"by the database's clock), whose report ids keep a client's resent batch "
                    f"from counting twice: drop the days before {latest} at the latest "
                    f"(--keep-days {self.replay_window_days} or more)")
            for name in self.partitions():
                if name >= cutoff:
                    continue
                try:
                    with self._pool.connection() as conn, conn.transaction():
                        conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
                        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)",
                                     (schema.LOCK_PARTITIONS,))
                        conn.execute(psql.SQL("DROP TABLE IF EXISTS {}").format(
                            psql.Identifier(schema.partition_name(name))))
                except psycopg.errors.LockNotAvailable:
                    self._retain_from(name)  # the days before it are gone
                    raise StorageError(
                        f"cannot drop the raw reports of {name} now: a transaction reading "
                        "them (veil check, veil archive, a decode) holds the table, and "
                        "waiting for it would hold up every upload behind the drop. Run "
                        "veil retention again once it ends"
                        + (f" (the days before {name} were dropped)" if dropped else "")
                    ) from None
                self._partitions.discard(name)
                dropped.append(name)
            self._retain_from(cutoff)
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
        first: dict[str, Row] = {}
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
            except MissingPartition as missing:
                with self._unavailable(f"create the partition of {missing.day}"):
                    self._ensure_partition(missing.day)
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

    def _insert_once(self, rows: list[Row], day: str | None, cap: DailyCap | None) -> int:
        """One attempt of :meth:`insert`'s transaction; the number of reports accepted."""
        if self._closed:
            raise StorageUnavailable("the storage is closed")
        sealed: int | None = None  # the day this transaction seals, once it commits
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
            # the day by the server's clock, and the lock that holds it open
            found = cursor.execute(schema.LOCK_TODAY if day is None else schema.LOCK_GIVEN_DAY,
                                   {"lock": schema.LOCK_DAY, "day": day}).fetchone()
            day = str(found[0]) if found else ""
            number = day_number(day)
            if day not in self._partitions:
                raise MissingPartition(day)
            if number not in self._sealed:
                # wait for every transaction still writing the previous day (once a day per
                # process), so the window check below sees their ids and no writer adds to
                # that day's shards any more; then fold them into one row per cohort
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (schema.LOCK_DAY, number - 1))
                cursor.execute(schema.FOLD_DAY, {"day": day_text(number - 1),
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
                {"day": day, "first": day_text(number - window), "before": day_text(number - 1),
                 "after": day_text(number + 1), "last": day_text(number + window)})
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
            self._prepare_ahead(day)
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

    def _aggregate_rows(self, rows: Sequence[Row], day: str, shard: int) -> list[str]:
        """``rows``' statistics per (metric, cohort) as lines of COPY's text format."""
        by_metric: dict[str, list[Row]] = {}
        for row in rows:
            by_metric.setdefault(row[1], []).append(row)
        out = []
        for name in sorted(by_metric):
            group = by_metric[name]
            metric, statistic = self._metric(name)
            cohorts = np.fromiter((row[2] for row in group), dtype=np.int64, count=len(group))
            for cohort, reports, state in statistic.accumulate(metric.params, cohorts,
                                                               [row[4] for row in group]):
                out.append(copy_line(aggregate_row(name, day, cohort, shard, reports,
                                                          statistic, state)))
        return out

    def _write_aggregates(self, cursor: psycopg.Cursor[Any], rows: list[tuple[Any, ...]]) -> None:
        """Add aggregate rows (:func:`~.rows.aggregate_row`'s) into the table, in one statement."""
        if rows:
            # the staging table empties at commit: a transaction that writes several times
            # (a rebuild) empties it itself, or would add earlier rows again
            cursor.execute("DELETE FROM veil_aggregate_staging")
            with cursor.copy(schema.COPY_AGGREGATES) as copy:
                copy.write("".join(copy_line(row) for row in rows))
            cursor.execute(schema.UPSERT_STAGED)
