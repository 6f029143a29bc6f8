"""How reports and statistics become SQLite rows: insert statements and aggregate columns.

Reports are appended with one statement per (metric, day) group: the ids (and
byte payloads) travel as one concatenated blob cut with ``substr()``, the
cohorts (and integer payloads, packed as ``cohort << 32 | payload`` when both fit, as
``[cohort, payload]`` pairs otherwise) as a JSON array
walked by ``json_each``, so SQLite runs the loop in C. ``executemany`` instead re-acquires the GIL for every row,
and while other request threads run Python that stalls the writer, which holds
the lock every writer waits on. Float payloads keep ``executemany``, so that the
stored values are the exact doubles received (JSON text would be re-parsed).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from veil.server.storage.base import (
    aggregate_columns,
    payload_array,
    sum_aggregate_rows,
    sums_agree,
)
from veil.server.storage.errors import StorageError
from veil.server.storage.sqlite.commit import Statement
from veil.shared.errors import ParameterError
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import COLUMN_TYPES, COLUMNS, State, Statistic, statistic_for

#: the metric and statistic of a metric name (:class:`StorageError` if there is none)
MetricOf = Callable[[str], tuple[Metric, Statistic]]


class DamagedRow(Exception):
    """A row holds what Veil never writes, though SQLite reads it: damage SQLite cannot see."""

_INSERT_REPORT = "INSERT INTO reports (id, metric, day, cohort, payload) VALUES (?, ?, ?, ?, ?)"
_INSERT_BYTES = (
    "INSERT INTO reports (id, metric, day, cohort, payload) "
    "SELECT substr(?1, key * 16 + 1, 16), ?2, ?3, value, substr(?4, key * ?5 + 1, ?5) "
    "FROM json_each(?6)"
)
_INSERT_INTS = (
    "INSERT INTO reports (id, metric, day, cohort, payload) "
    "SELECT substr(?1, key * 16 + 1, 16), ?2, ?3, value ->> 0, value ->> 1 FROM json_each(?4)"
)
#: integer payloads below 2^32 with a cohort each, as one integer ``cohort << 32 | payload``
#: (a third of the time of a JSON pair, which SQLite parses again for each of its two values)
_INSERT_PACKED_INTS = (
    "INSERT INTO reports (id, metric, day, cohort, payload) "
    "SELECT substr(?1, key * 16 + 1, 16), ?2, ?3, value >> 32, value & 4294967295 "
    "FROM json_each(?4)"
)
#: packing holds payloads below this and cohorts below half of it (signed 64-bit integers)
PAYLOAD_LIMIT = 1 << 32

UPSERT = (
    f"INSERT INTO folded_aggregates (metric, day, cohort, reports, {', '.join(COLUMNS)}) "
    f"VALUES (?, ?, ?, ?{', ?' * len(COLUMNS)}) "
    "ON CONFLICT (metric, day, cohort) DO UPDATE SET reports = reports + excluded.reports, "
    + ", ".join(
        f"{c} = add_counts({c}, excluded.{c})" if COLUMN_TYPES[c] == "counts"
        else f"{c} = {c} + excluded.{c}"
        for c in COLUMNS
    )
)
#: the counters of one (metric, day)'s cohorts added in one statement, so that SQLite runs
#: the loop (as :data:`_INSERT_BYTES` does): ``?3`` holds the counter vectors of ``?4``
#: bytes each, ``?5`` each cohort's ``cohort << 32 | reports`` (:data:`UPSERT` takes the
#: rare cohort of 2^31 or more, or 2^32 reports); ``{column}`` is the statistic's counts
#: column. ``WHERE true`` tells SQLite's parser that ``ON CONFLICT``
#: belongs to the upsert, not to a join
_UPSERT_COUNTERS = (
    "INSERT INTO folded_aggregates (metric, day, cohort, reports, {column}) "
    "SELECT ?1, ?2, value >> 32, value & 4294967295, substr(?3, key * ?4 + 1, ?4) "
    "FROM json_each(?5) WHERE true "
    "ON CONFLICT (metric, day, cohort) DO UPDATE SET reports = reports + excluded.reports, "
    "{column} = add_counts({column}, excluded.{column})"
)
#: aggregate rows ``(cohort, reports, *COLUMNS)`` of one metric over a range of days
SELECT_AGGREGATES = (
    f"SELECT cohort, reports, {', '.join(COLUMNS)} FROM folded_aggregates "
    "WHERE metric = ? AND day >= ? AND day <= ?"
)


def stored_registry(conn: sqlite3.Connection) -> Registry | None:
    """The registry recorded in ``meta`` (``None`` if none); :class:`DamagedRow` if it is not
    what Veil writes."""
    row = conn.execute("SELECT CAST(value AS BLOB) FROM meta WHERE key = 'registry'").fetchone()
    if row is None:
        return None
    try:
        record = json.loads(bytes(row[0]).decode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise DamagedRow(f"the registry stored in meta cannot be read ({exc})") from None
    try:
        return Registry.from_record(record)
    except ParameterError as exc:  # sound JSON Veil wrote, with what this Veil refuses
        raise StorageError(f"the registry stored in the file declares what this Veil refuses "
                           f"({exc}): read the file with the Veil that wrote it") from None
    except (TypeError, ValueError) as exc:
        raise DamagedRow(f"the registry stored in meta cannot be read ({exc})") from None


def stored_metrics(conn: sqlite3.Connection) -> MetricOf:
    """The metric and statistic of a name in the registry recorded in the file: every report
    in it is of one of those metrics, whichever registry the process reading it was given
    (a worker started before the registry gained a metric reads another worker's reports)."""
    registry = stored_registry(conn)
    metrics = {name: (metric, statistic_for(metric.params))
               for name, metric in (registry.items() if registry else ())}

    def metric_of(name: str) -> tuple[Metric, Statistic]:
        if name not in metrics:
            raise StorageError(f"a report of metric {name!r}, which the registry lacks")
        return metrics[name]

    return metric_of


def add_counts(left: bytes | None, right: bytes | None) -> bytes | None:
    """SQL function ``add_counts``: element-wise sum of two uint64 counter BLOBs."""
    if left is None:
        return right
    if right is None:
        return left
    if len(left) != len(right):
        raise ValueError("add_counts: counter blobs of different lengths")
    if len(left) <= 8 * _STRUCT_COUNTERS and len(left) % 8 == 0:
        layout = _counter_layout(len(left) // 8)
        return layout.pack(*[a + b for a, b in zip(layout.unpack(left), layout.unpack(right),
                                                   strict=True)])
    total: bytes = (np.frombuffer(left, dtype="<u8") + np.frombuffer(right, dtype="<u8")).tobytes()
    return total


#: up to this many counters :func:`add_counts` adds with :mod:`struct`, in half NumPy's
#: time per call (a fold adds thousands of short vectors: an FLH or OLH cohort's few)
_STRUCT_COUNTERS = 16


@functools.cache
def _counter_layout(counters: int) -> struct.Struct:
    return struct.Struct(f"<{counters}Q")


def group_by_metric_day(rows: Iterable[tuple[Any, ...]],
                        ) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """``(id, metric, day, cohort, payload)`` rows grouped by ``(metric, day)``."""
    groups: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault((row[1], row[2]), []).append(row)
    return groups


def insert_statement(statistic: Statistic, name: str, day: str,
                     group: list[tuple[Any, ...]]) -> Statement:
    """The statement that appends one (metric, day) group of rows to ``reports``."""
    ids = b"".join(row[0] for row in group)
    if statistic.payload_type == "bytes":
        width = len(group[0][4])  # validation fixed every payload's length for the metric
        cohorts = json.dumps([row[3] for row in group])
        payloads = b"".join(row[4] for row in group)
        return _INSERT_BYTES, (ids, name, day, payloads, width, cohorts), False
    if statistic.payload_type == "int":
        cohort_ints: list[int] = [row[3] for row in group]
        payload_ints: list[int] = [row[4] for row in group]
        if (min(cohort_ints) >= 0 and max(cohort_ints) < PAYLOAD_LIMIT // 2
                and min(payload_ints) >= 0 and max(payload_ints) < PAYLOAD_LIMIT):
            packed = [cohort << 32 | payload
                      for cohort, payload in zip(cohort_ints, payload_ints, strict=True)]
            return _INSERT_PACKED_INTS, (ids, name, day, json.dumps(packed)), False
        return _INSERT_INTS, (ids, name, day, json.dumps([(row[3], row[4]) for row in group])), False
    return _INSERT_REPORT, group, True


def aggregate_row(name: str, day: str, cohort: int, reports: int, statistic: Statistic,
                  state: State) -> tuple[Any, ...]:
    """The upsert row ``(metric, day, cohort, reports, *COLUMNS)`` of one cohort's state
    (counters as little-endian uint64 BLOBs)."""
    return (name, day, cohort, reports,
            *aggregate_columns(statistic, state, lambda v: v.astype("<u8").tobytes()))


def blob_counters(rows: Sequence[Sequence[Any]], at: int, length: int) -> np.ndarray:
    """Counter BLOBs of column ``at`` of aggregate rows as a ``(len(rows), length)`` array."""
    return np.frombuffer(b"".join(row[at] for row in rows), dtype="<u8").reshape(-1, length)


def sum_aggregates(statistic: Statistic, metric: Metric, rows: Sequence[tuple[Any, ...]],
                   ) -> tuple[np.ndarray, list[State]]:
    """Reports per cohort and per-cohort states summed from :data:`SELECT_AGGREGATES` rows;
    :class:`DamagedRow` if a row is not what Veil writes (a cohort or counter blob out of shape)."""
    try:
        return sum_aggregate_rows(statistic, metric, rows, blob_counters)
    except (ValueError, TypeError, IndexError) as exc:
        raise DamagedRow(f"an aggregate row of metric {metric.name!r} is malformed ({exc})") from exc


def aggregate_statement(name: str, day: str, metric: Metric, statistic: Statistic,
                        cohorts: np.ndarray, payloads: np.ndarray) -> Statement:
    """The statement that adds reports of metric ``name`` on ``day`` to the aggregates: their
    ``cohorts`` (int64) and ``payloads`` as
    :meth:`~veil.shared.statistics.Statistic.accumulate_arrays` takes them. A statistic of
    one counts vector is added in one statement (:data:`_UPSERT_COUNTERS`), any other with
    :data:`UPSERT` for each cohort."""
    counted = statistic.accumulate_counters(metric.params, cohorts, payloads)
    if counted is None or (len(counted.reports) and (counted.reports.max() >= PAYLOAD_LIMIT or
                                                      counted.cohorts.max() >= PAYLOAD_LIMIT // 2)):
        return UPSERT, [aggregate_row(name, day, cohort, reports, statistic, state)
                        for cohort, reports, state
                        in statistic.accumulate_arrays(metric.params, cohorts, payloads)], True
    blob = np.ascontiguousarray(counted.counters, dtype="<u8").tobytes()
    packed = json.dumps((counted.cohorts << 32 | counted.reports).tolist())
    return (_UPSERT_COUNTERS.format(column=statistic.fields[0].column),
            (name, day, blob, 8 * counted.counters.shape[1], packed), False)


def report_arrays(metric: Metric, statistic: Statistic, cohorts: Sequence[int] | np.ndarray,
                  payloads: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stored reports' ``cohorts`` (as int64) and ``payloads`` (:func:`payload_array`, or
    an array of integer payloads) as :func:`aggregate_statement` takes them; ``ValueError``
    for a cohort the metric does not have (which could make the counters of a cohort far
    beyond them), or for an array holding values that are no integers."""
    if isinstance(cohorts, np.ndarray):
        if cohorts.size and cohorts.dtype.kind not in "iu":
            raise ValueError("a stored report's cohort is no integer")
        array = cohorts.astype(np.int64, copy=False)
    else:
        array = np.fromiter(cohorts, dtype=np.int64, count=len(cohorts))
    if isinstance(payloads, np.ndarray) and payloads.size and payloads.dtype.kind not in "iu":
        raise ValueError("a stored report's payload is no integer")
    if len(array) and (array.min() < 0 or array.max() >= metric.params.cohorts):
        raise ValueError(f"a stored report's cohort lies outside [0, {metric.params.cohorts})")
    if isinstance(payloads, np.ndarray):
        return array, payloads.astype(np.int64, copy=False)  # integers, checked above
    return array, payload_array(statistic.payload_type, payloads)


def execute(conn: sqlite3.Connection, statement: Statement) -> None:
    """Run a :data:`~.commit.Statement`."""
    sql, parameters, many = statement
    if many:
        conn.executemany(sql, parameters)
    else:
        conn.execute(sql, parameters)


def aggregate_statements(groups: dict[tuple[str, str], list[tuple[Any, ...]]],
                         metric_of: MetricOf) -> list[Statement]:
    """The statements that add grouped ``(id, metric, day, cohort, payload)`` report rows to
    the aggregates (:func:`aggregate_statement`)."""
    out = []
    for (name, day), group in groups.items():
        metric, statistic = metric_of(name)
        arrays = report_arrays(metric, statistic, [row[3] for row in group],
                               [row[4] for row in group])
        out.append(aggregate_statement(name, day, metric, statistic, *arrays))
    return out


def recount(conn: sqlite3.Connection, metric_of: MetricOf, through: int | None = None) -> int:
    """Recount the table ``folded_aggregates`` from ``reports`` (those at rowids up to ``through``
    if given): the rows of every (metric, day) that has raw reports are deleted and
    counted again; those of a (metric, day) without any (set by ``veil aggregate`` from an
    archive, or whose reports were deleted) are kept, having nothing to be recounted from.
    Return the number of reports. The caller holds the transaction. :class:`DamagedRow`
    for a report that Veil cannot have stored (unknown metric, payload out of shape)."""
    # no ORDER BY: upserts add up in any order, and arrival order already groups days,
    # where sorting a large table would need a temporary copy of it
    cursor = conn.execute("SELECT id, metric, day, cohort, payload FROM reports"
                          + ("" if through is None else " WHERE rowid <= ?"),
                          () if through is None else (through,))
    total = 0
    cleared: set[tuple[str, str]] = set()
    while True:
        chunk = cursor.fetchmany(50_000)
        if not chunk:
            break
        groups = group_by_metric_day(chunk)
        # a (metric, day)'s old rows go when its first report is met: one scan of the reports
        new = [key for key in groups if key not in cleared]
        conn.executemany("DELETE FROM folded_aggregates WHERE metric = ? AND day = ?", new)
        cleared.update(new)
        try:
            statements = aggregate_statements(groups, metric_of)
        except (ValueError, TypeError, IndexError, StorageError) as exc:
            raise DamagedRow(f"a stored report cannot be counted ({exc})") from exc
        for statement in statements:
            execute(conn, statement)
        total += len(chunk)
    return total


def _aggregate_columns(alias: str) -> str:
    return ", ".join(f"{alias}.{column}" for column in ("reports", *COLUMNS))


#: aggregate rows of ``main`` and ``temp`` (a recount) that differ in any column, or exist in one
#: only: ``(metric, day, cohort, *stored columns, *recounted columns)``, NULLs for a missing row
_DIFFERENCES = (
    f"SELECT s.metric, s.day, s.cohort, {_aggregate_columns('s')}, {_aggregate_columns('r')} "
    "FROM main.folded_aggregates AS s LEFT JOIN temp.folded_aggregates AS r "
    "ON r.metric = s.metric AND r.day = s.day AND r.cohort = s.cohort WHERE "
    "EXISTS (SELECT 1 FROM temp.folded_aggregates AS t WHERE t.metric = s.metric AND t.day = s.day) "
    "AND (" + " OR ".join(f"r.{column} IS NOT s.{column}" for column in ("reports", *COLUMNS))
    + ")"
    + f" UNION ALL SELECT r.metric, r.day, r.cohort, {', '.join(['NULL'] * (1 + len(COLUMNS)))}, "
    f"{_aggregate_columns('r')} FROM temp.folded_aggregates AS r WHERE NOT EXISTS (SELECT 1 FROM "
    "main.folded_aggregates AS s WHERE s.metric = r.metric AND s.day = r.day AND s.cohort = r.cohort) "
    "ORDER BY 1, 2, 3"
)


#: (metric, day) pairs of ``main`` whose aggregates have no raw report behind them (no row
#: of the recount in ``temp``): set from an archive, or their reports deleted
UNVERIFIED = ("SELECT count(*) FROM (SELECT DISTINCT metric, day FROM main.folded_aggregates AS s "
              "WHERE NOT EXISTS (SELECT 1 FROM temp.folded_aggregates AS t WHERE t.metric = s.metric "
              "AND t.day = s.day))")
#: report ids stored, merged or recent: more than the raw reports when reports were deleted
#: or lost
STORED_IDS = ("SELECT (SELECT count(*) FROM main.report_ids) + (SELECT count(*) FROM "
              "main.recent_ids)")


def differences(conn: sqlite3.Connection) -> list[str]:
    """How the aggregates of ``main`` differ from a recount in ``temp.folded_aggregates``, one line
    per ``(metric, day, cohort)``. Counts must match exactly; sums to :data:`REAL_TOLERANCE`."""
    width = 1 + len(COLUMNS)
    out = []
    for row in conn.execute(_DIFFERENCES):
        metric, day, cohort = row[:3]
        stored, recounted = row[3 : 3 + width], row[3 + width :]
        where = f"metric {metric!r}, day {day}, cohort {cohort}"
        if stored[0] is None:
            out.append(f"{where}: no aggregate row, but {recounted[0]} stored reports")
        elif recounted[0] is None:
            out.append(f"{where}: an aggregate row of {stored[0]} reports, but no stored report")
        else:
            columns = [
                column for column, a, b in zip(("reports", *COLUMNS), stored, recounted, strict=True)
                if a != b and not (COLUMN_TYPES.get(column) == "real" and sums_agree(a, b, stored[0]))
            ]
            if columns:
                out.append(f"{where}: {', '.join(columns)} differ from a recount of the reports")
    return out


