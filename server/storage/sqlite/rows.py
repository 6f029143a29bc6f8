"""How reports and statistics become SQLite rows: insert statements and aggregate columns.

Reports are appended with one statement per (metric, day) group: the ids (and
byte payloads) travel as one concatenated blob cut with ``substr()``, the
cohorts (and integer payloads) as a JSON array walked by ``json_each``, so SQLite
runs the loop in C. ``executemany`` instead re-acquires the GIL for every row,
and while other request threads run Python that stalls the writer, which holds
the lock every writer waits on. Float payloads keep ``executemany``, so that the
stored values are the exact doubles received (JSON text would be re-parsed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from veil.server.storage.sqlite.commit import Statement
from veil.shared.registry import Metric
from veil.shared.statistics import COLUMNS, STATISTICS, State, Statistic

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

#: the type of field each statistic column holds (``counts`` columns add up with add_counts)
_COLUMN_TYPES = {field.column: field.type for statistic in STATISTICS.values()
                 for field in statistic.fields}
UPSERT = (
    f"INSERT INTO aggregates (metric, day, cohort, reports, {', '.join(COLUMNS)}) "
    f"VALUES (?, ?, ?, ?{', ?' * len(COLUMNS)}) "
    "ON CONFLICT (metric, day, cohort) DO UPDATE SET reports = reports + excluded.reports, "
    + ", ".join(
        f"{c} = add_counts({c}, excluded.{c})" if _COLUMN_TYPES[c] == "counts"
        else f"{c} = {c} + excluded.{c}"
        for c in COLUMNS
    )
)
#: aggregate rows ``(cohort, reports, *COLUMNS)`` of one metric over a range of days
SELECT_AGGREGATES = (
    f"SELECT cohort, reports, {', '.join(COLUMNS)} FROM aggregates "
    "WHERE metric = ? AND day >= ? AND day <= ?"
)


def add_counts(left: bytes | None, right: bytes | None) -> bytes | None:
    """SQL function ``add_counts``: element-wise sum of two uint64 counter BLOBs."""
    if left is None:
        return right
    if right is None:
        return left
    a = np.frombuffer(left, dtype="<u8")
    b = np.frombuffer(right, dtype="<u8")
    if a.shape != b.shape:
        raise ValueError("add_counts: counter blobs of different lengths")
    total: bytes = (a + b).tobytes()
    return total


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
        return _INSERT_INTS, (ids, name, day, json.dumps([(row[3], row[4]) for row in group])), False
    return _INSERT_REPORT, group, True


def aggregate_row(name: str, day: str, cohort: int, reports: int, statistic: Statistic,
                  state: State) -> tuple[Any, ...]:
    """The upsert row ``(metric, day, cohort, reports, *COLUMNS)`` of one cohort's state."""
    columns: list[Any] = [None] * len(COLUMNS)
    for field in statistic.fields:
        value = state[field.name]
        if field.type == "counts":
            value = np.asarray(value).astype("<u8").tobytes()
        elif field.type == "count":
            value = int(value)
        else:
            value = float(value)
        columns[COLUMNS.index(field.column)] = value
    return (name, day, cohort, reports, *columns)


def sum_aggregates(statistic: Statistic, metric: Metric, rows: Sequence[tuple[Any, ...]],
                   ) -> tuple[np.ndarray, list[State]]:
    """Reports per cohort and per-cohort states summed from :data:`SELECT_AGGREGATES` rows."""
    cohorts = metric.params.cohorts
    cohort_ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
    reports = np.zeros(cohorts, dtype=np.int64)
    np.add.at(reports, cohort_ids, [row[1] for row in rows])
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
    return reports, states
