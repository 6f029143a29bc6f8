"""Aggregates counted in bulk: the raw reports past the fold mark are counted when read.

The aggregates count every report up to the rowid kept in ``meta`` as ``folded_rowid``,
the *fold mark*; the reports past it are the *tail*. An insert whose reports touch few
aggregate rows, with nothing waiting, counts them in its own transaction and moves the
mark past them (:func:`count_now`: a batch from one installation, as the SDK uploads);
any other insert appends its reports only. Once :data:`FOLD_LIMIT` reports are past the
mark, or once a report of a day that is over (UTC) waits (at the first insert after
midnight, or right after an insert under an earlier day), the writer that stored them
folds the tail in, in a transaction of its own: it counts those reports into
``folded_aggregates`` (one statement per (metric, day), upserting the row of each cohort
they touch: :func:`~.rows.aggregate_statement`) and moves the mark
past them. Readers add the tail to the
aggregates they read, in one read transaction, so a count is always that of every
stored report, folded or not.

Updating the aggregates at every insert cost one upsert per cohort present in the batch,
and each aggregate row it touched was written to the WAL whole at every commit: a
batch spread over an oracle's 4,096 cohorts rewrote most of a day's aggregates. Folded
in bulk, a row is written once per :data:`FOLD_LIMIT` reports (figures in
docs/operations.md, Performance and scaling).

The mark is a rowid, ``reports.seq``. ``reports`` is append-only, so a new report's rowid
is above every stored one, and SQLite keeps a named rowid when it copies the file
(``VACUUM INTO``) or vacuums it. Should reports be deleted by hand so that rowids at
or below the mark are free again, an insert first lowers the mark to the highest stored
rowid, which every folded report is at or below, so that no new report is taken for a
folded one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from veil.server.storage.base import today
from veil.server.storage.errors import StorageError
from veil.server.storage.sqlite import rows as sql
from veil.server.storage.sqlite.commit import Statement
from veil.shared.registry import Metric
from veil.shared.statistics import Statistic

#: reports past the fold mark at which a writer folds them into the aggregates. A reader
#: of counts reads at most about this many raw reports besides the aggregates; a larger
#: limit writes each aggregate row less often, in longer folds
FOLD_LIMIT = 32_768

_MARK_KEY = "folded_rowid"
#: at most this many aggregate rows touched, an insert's reports are counted in its own
#: transaction when nothing waits (:func:`count_now`): a few upserts cost less than reading
#: the reports again in a fold, many (a relay's batch over thousands of cohorts) more
DIRECT_ROWS = 64
#: seconds after a failed fold when the next is tried, however few reports came since
RETRY_SECONDS = 60.0
#: the mark of a new file (every report past it); ``meta`` holds it from schema version 6
CREATE_MARK = f"INSERT OR IGNORE INTO meta (key, value) VALUES ('{_MARK_KEY}', '0')"
_SET_MARK = (f"INSERT INTO meta (key, value) VALUES ('{_MARK_KEY}', ?) "
             "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
#: the (metric, day) pairs of the reports at rowids ``?1`` (excluded) to ``?2``
_PAIRS = "SELECT DISTINCT metric, day FROM reports WHERE rowid > ? AND rowid <= ?"
#: ``(cohort, payload)`` of the reports at rowids ``?1`` (excluded) to ``?2`` of metric ``?3``
#: on day ``?4``
_PAIR = ("SELECT cohort, payload FROM reports "
         "WHERE rowid > ? AND rowid <= ? AND metric = ? AND day = ?")
#: a payload as JSON when it is an integer, else null (a BLOB would stop ``json_group_array``
#: with an error; a null is refused as "no integer" by :func:`~.rows.report_arrays`)
_INTEGER = "CASE typeof(payload) WHEN 'integer' THEN payload END"
#: :data:`_PAIR`'s cohorts and payloads as two JSON arrays (integer payloads): half the time
#: of a Python tuple a report
_PAIR_INTS = (f"SELECT json_group_array(cohort), json_group_array({_INTEGER}) FROM reports "
              "WHERE rowid > ? AND rowid <= ? AND metric = ? AND day = ?")
#: :data:`_PAIR_INTS` of every (metric, day) of the metrics ``{names}`` in one scan (its sort
#: costs more than one pair's read, less than two)
_GROUPED_INTS = ("SELECT metric, day, json_group_array(cohort), "
                 f"json_group_array({_INTEGER}) FROM reports WHERE rowid > ? AND rowid <= ? "
                 "AND metric IN ({names}) GROUP BY metric, day")
#: the cohorts and payloads of the reports past a mark (``?1``) of metric ``?2`` over days
#: ``?3``..``?4``, as two JSON arrays (an integer metric's)
_OF_METRIC_INTS = (f"SELECT json_group_array(cohort), json_group_array({_INTEGER}) "
                   "FROM reports WHERE rowid > ?1 AND metric = ?2 AND day BETWEEN ?3 AND ?4")
#: ``(cohort, payload)`` of the reports past a mark (``?1``) of metric ``?2`` over days
#: ``?3``..``?4``
_OF_METRIC = ("SELECT cohort, payload FROM reports "
              "WHERE rowid > ?1 AND metric = ?2 AND day BETWEEN ?3 AND ?4")

def mark(conn: sqlite3.Connection) -> int:
    """The fold mark; :class:`~.rows.DamagedRow` if ``meta`` lacks it or holds no rowid."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (_MARK_KEY,)).fetchone()
    try:
        value = int(row[0]) if row is not None else -1
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise sql.DamagedRow(f"the fold mark ({_MARK_KEY} in the table meta) is "
                             f"{'missing' if row is None else repr(row[0])}, not a rowid")
    return value


def set_mark(conn: sqlite3.Connection, rowid: int) -> None:
    """Move the fold mark to ``rowid`` (the caller holds the write transaction)."""
    conn.execute(_SET_MARK, (str(rowid),))


def highest_rowid(conn: sqlite3.Connection) -> int:
    """The rowid of the last stored report (0 without any)."""
    return int(conn.execute("SELECT coalesce(max(rowid), 0) FROM reports").fetchone()[0])


@dataclasses.dataclass(frozen=True)
class Waiting:
    """The reports past the fold mark as an insert begins: the ``mark``, the ``highest``
    stored rowid and the day of the first report past the mark (``since``, ``None``
    without any)."""

    mark: int
    highest: int
    since: str | None

    def after(self, stored: int) -> int:
        """How many reports wait once ``stored`` more are appended."""
        return self.highest - self.mark + stored

    def fold_due(self, stored: int, days: Iterable[str], limit: int) -> bool:
        """Whether to fold once ``stored`` more reports, of ``days``, are appended: at
        least ``limit`` wait, or a report of a day that is over (UTC) does."""
        oldest = min([*days, *([self.since] if self.since else [])], default=None)
        return self.after(stored) >= limit or (oldest is not None and oldest < today())


@dataclasses.dataclass
class FoldRetry:
    """When a writer tries a fold again after one failed: once twice as many reports wait
    as did then, or :data:`RETRY_SECONDS` later. A fold that keeps failing (a damaged
    report, a full disk) then reads the waiting reports once each time they double, not at
    every commit, which made every insert slower as they piled up."""

    #: reports waiting when the last fold failed (0: it did not)
    waiting: int = 0
    #: when it failed (``time.monotonic()``)
    failed_at: float = 0.0

    def allows(self, waiting: int, now: float) -> bool:
        """Whether a fold may be tried with ``waiting`` reports waiting at ``now``."""
        return (not self.waiting or waiting >= 2 * self.waiting
                or now - self.failed_at >= RETRY_SECONDS)

    def failed(self, waiting: int, now: float) -> None:
        """A fold of ``waiting`` reports failed at ``now``."""
        self.waiting, self.failed_at = waiting, now

    def succeeded(self) -> None:
        """A fold succeeded: the next one is tried when due."""
        self.waiting = 0


def waiting(conn: sqlite3.Connection) -> Waiting:
    """The reports past the fold mark as an insert begins (the caller holds the write
    transaction). If reports were deleted from the top of ``reports`` so that rowids at or
    below the mark are free again, the mark is first lowered to the highest stored rowid."""
    folded, highest = mark(conn), highest_rowid(conn)
    if highest < folded:
        set_mark(conn, highest)
        folded = highest
    since = None
    if highest > folded:
        row = conn.execute("SELECT day FROM reports WHERE rowid > ? ORDER BY rowid LIMIT 1",
                           (folded,)).fetchone()
        since = str(row[0])
    return Waiting(folded, highest, since)


def count_now(conn: sqlite3.Connection, waiting: Waiting, rows: list[tuple[Any, ...]],
              metric_of: sql.MetricOf) -> bool:
    """Count an insert's ``(id, metric, day, cohort, payload)`` rows into the aggregates in
    its own transaction and move the mark past them, when nothing waits past the mark and
    they touch at most :data:`DIRECT_ROWS` aggregate rows (a batch from one installation,
    as the SDK uploads); ``False`` (nothing done) otherwise."""
    if waiting.highest != waiting.mark or not rows \
            or len({(row[1], row[2], row[3]) for row in rows}) > DIRECT_ROWS:
        return False
    for statement in sql.aggregate_statements(sql.group_by_metric_day(rows), metric_of):
        sql.execute(conn, statement)
    set_mark(conn, highest_rowid(conn))
    return True


def fold(conn: sqlite3.Connection, metric_of: sql.MetricOf) -> int:
    """Count every report past the fold mark into ``folded_aggregates`` and move the mark past
    them (the caller holds the write transaction); returns how many were folded."""
    start, end = mark(conn), highest_rowid(conn)
    folded = 0
    for statement, reports in _counted_pairs(conn, metric_of, start, end):
        sql.execute(conn, statement)
        folded += reports
    set_mark(conn, end)
    return folded


def check_tail(conn: sqlite3.Connection, metric_of: sql.MetricOf) -> int:
    """How many reports are past the fold mark, each counted to prove it can be
    (:class:`~.rows.DamagedRow` if not), in the caller's transaction."""
    return sum(reports for _, reports in
               _counted_pairs(conn, metric_of, mark(conn), highest_rowid(conn)))


def _counted_pairs(conn: sqlite3.Connection, metric_of: sql.MetricOf, start: int, end: int,
                   ) -> Iterator[tuple[Statement, int]]:
    """For each (metric, day) of the reports at rowids ``start`` (excluded) to ``end``: the
    statement that adds them to the aggregates and how many reports it counts;
    :class:`~.rows.DamagedRow` for a report Veil cannot have stored. The pairs of integer
    metrics are read in one scan when there are several (:func:`_grouped_ints`)."""
    pairs = conn.execute(_PAIRS, (start, end)).fetchall()
    grouped = _grouped_ints(conn, metric_of, pairs, start, end)
    for name, day in pairs:
        with _countable(name):
            metric, statistic = metric_of(name)
            if statistic.payload_type == "int":
                arrays = _json_arrays(metric, statistic, *(grouped.get((name, day)) or conn.execute(
                    _PAIR_INTS, (start, end, name, day)).fetchone()))
            else:
                arrays = _arrays(metric, statistic,
                                 conn.execute(_PAIR, (start, end, name, day)).fetchall())
            statement = sql.aggregate_statement(name, day, metric, statistic, *arrays)
        yield statement, len(arrays[0])


def _grouped_ints(conn: sqlite3.Connection, metric_of: sql.MetricOf,
                  pairs: list[tuple[str, str]], start: int, end: int,
                  ) -> dict[tuple[str, str], tuple[str, str]]:
    """The cohorts and payloads (two JSON arrays) of every pair of an integer metric, read
    in one scan where there are two pairs or more (each pair's own read scans the reports
    again: a fold over a hundred metrics took 0.14 s, not 0.04); empty otherwise. A metric
    the registry lacks is left to the caller, which calls it damage."""
    names = set()
    for name, _ in pairs:
        try:
            if metric_of(name)[1].payload_type == "int":
                names.add(name)
        except StorageError:
            continue
    if sum(name in names for name, _ in pairs) < 2:
        return {}
    statement = _GROUPED_INTS.format(names=", ".join("?" * len(names)))
    return {(name, day): (cohorts, payloads) for name, day, cohorts, payloads
            in conn.execute(statement, (start, end, *sorted(names)))}


def _json_arrays(metric: Metric, statistic: Statistic, cohorts: str, payloads: str,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The cohorts and payloads SQLite wrote as two JSON arrays, as checked arrays
    (:func:`~.rows.report_arrays`)."""
    return sql.report_arrays(metric, statistic, np.asarray(json.loads(cohorts)),
                             np.asarray(json.loads(payloads)))


@contextlib.contextmanager
def _countable(name: str) -> Iterator[None]:
    """:class:`~.rows.DamagedRow` for a stored report of metric ``name`` that cannot be counted
    (its metric, cohort or payload out of what Veil stores)."""
    try:
        yield
    except (ValueError, TypeError, IndexError, StorageError) as exc:
        raise sql.DamagedRow(f"a stored report of metric {name!r} cannot be counted "
                             f"({exc})") from exc


def _arrays(metric: Metric, statistic: Statistic, reports: list[tuple[Any, Any]],
            ) -> tuple[np.ndarray, np.ndarray]:
    """The cohorts and payloads of ``(cohort, payload)`` rows as arrays
    (:func:`~.rows.report_arrays`)."""
    return sql.report_arrays(metric, statistic, [row[0] for row in reports],
                             [row[1] for row in reports])


def tail_rows(conn: sqlite3.Connection, metric_of: sql.MetricOf, name: str, start: str,
              end: str) -> list[tuple[Any, ...]]:
    """Aggregate rows ``(cohort, reports, *COLUMNS)`` (as :data:`~.rows.SELECT_AGGREGATES`
    reads them) counting the reports of metric ``name`` past the fold mark over days
    ``start``..``end``, read in the caller's transaction: one row per cohort, all days
    together (the reader sums over the days anyway); :class:`~.rows.DamagedRow` for a
    report Veil cannot have stored."""
    with _countable(name):
        metric, statistic = metric_of(name)
        parameters = (mark(conn), name, start, end)
        if statistic.payload_type == "int":  # as a fold reads them: the same reports damaged
            arrays = _json_arrays(metric, statistic,
                                  *conn.execute(_OF_METRIC_INTS, parameters).fetchone())
        else:
            arrays = _arrays(metric, statistic, conn.execute(_OF_METRIC, parameters).fetchall())
        if not len(arrays[0]):
            return []
        return [sql.aggregate_row(name, start, cohort, n, statistic, state)[2:]
                for cohort, n, state in statistic.accumulate_arrays(metric.params, *arrays)]


#: reports per (metric, day) over days ``?1``..``?2``: the aggregates and the reports past
#: the fold mark ``?3``; ``{metric}`` is empty or ``AND metric = ?4``
DAILY_REPORTS = (
    "SELECT metric, day, sum(reports) FROM ("
    "SELECT metric, day, reports FROM folded_aggregates WHERE day BETWEEN ?1 AND ?2 {metric} "
    "UNION ALL SELECT metric, day, count(*) FROM reports WHERE rowid > ?3 "
    "AND day BETWEEN ?1 AND ?2 {metric} GROUP BY metric, day) "
    "GROUP BY metric, day ORDER BY metric, day"
)
#: the metrics that have aggregates or reports past the fold mark ``?``
COUNTED_METRICS = "SELECT metric FROM folded_aggregates UNION SELECT metric FROM reports WHERE rowid > ?"
