"""The work of one (metric, day, bucket), engine-neutral: Arrow tables or Parquet files in,
per-cohort statistics out.

:func:`aggregate_bucket` reads the files of one bucket, keeps one report of each id
(:func:`first_occurrences`) and accumulates the metric's statistic with NumPy
(:meth:`~veil.shared.statistics.Statistic.accumulate_arrays`). It imports neither Dask nor
any other engine, so Dask (:func:`veil.server.archive.aggregate`), Spark, Ray or a plain
loop can run it: it is a pure function of its inputs, its result is picklable, and
partial results of one (metric, day) combine with :meth:`BucketAggregate.merge` in any
order. Every copy of an id lies in the same bucket (see :mod:`~veil.server.archive.layout`),
so deduplicating each bucket deduplicates the day.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from veil.server.archive.layout import ID_BYTES, ArchiveError, from_table
from veil.shared.registry import Metric
from veil.shared.statistics import State, statistic_for

#: log2 of the largest bitmap :func:`first_occurrences` builds (16 MiB)
MAX_BITMAP_BITS = 24
#: what :func:`aggregate_bucket` reads: an Arrow table, or the path of a Parquet file
Source: TypeAlias = "pa.Table | str | os.PathLike[str]"


@dataclasses.dataclass
class BucketAggregate:
    """Per-cohort statistics of some reports of one metric: ``reports[c]`` and ``states[c]``
    for every cohort ``c`` (zeros where there are none), as
    :meth:`~veil.server.storage.Storage.replace_aggregates` takes them.

    ``rows``: reports read; ``duplicates``: copies of an id already read, left out
    (``reports.sum() == rows - duplicates``).
    """

    reports: np.ndarray
    states: list[State]
    rows: int = 0
    duplicates: int = 0

    @classmethod
    def empty(cls, metric: Metric) -> BucketAggregate:
        """The aggregate of no reports of ``metric``."""
        statistic = statistic_for(metric.params)
        cohorts = metric.params.cohorts
        return cls(np.zeros(cohorts, dtype=np.int64),
                   [statistic.zero(metric.params) for _ in range(cohorts)])

    def merge(self, other: BucketAggregate, metric: Metric) -> BucketAggregate:
        """The aggregate of both sets of reports (disjoint: another bucket, or another day),
        merged with the statistic's own :meth:`~veil.shared.statistics.Statistic.merge`."""
        statistic = statistic_for(metric.params)
        return BucketAggregate(
            self.reports + other.reports,
            [statistic.merge(a, b) for a, b in zip(self.states, other.states, strict=True)],
            self.rows + other.rows, self.duplicates + other.duplicates)


def first_occurrences(ids: np.ndarray) -> np.ndarray | None:
    """Which rows to keep so that each id appears once: a boolean mask keeping the first
    row of every id of an ``(n, 16)`` uint8 array, or ``None`` when all ids differ.

    Exact, and fast when duplicates are rare: one sort of the ids' first 8 bytes finds the
    values that occur more than once (usually none). The rows carrying one of them are
    found through a bitmap of their low bits (a lookup per row, where a binary search per
    row was ten times slower), and only those rows are compared whole.
    """
    ids = np.ascontiguousarray(ids, dtype=np.uint8).reshape(-1, ID_BYTES)
    words = ids.view(np.uint64)
    heads = words[:, 0]
    ordered = np.sort(heads)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(repeated):
        return None
    repeated = np.unique(repeated)
    # a bitmap 64 times larger than the repeated values: 1 row in 64 at most passes wrongly
    size = 1 << min(MAX_BITMAP_BITS, max(10, (64 * len(repeated)).bit_length()))
    low = np.uint64(size - 1)
    bitmap = np.zeros(size, dtype=bool)
    bitmap[repeated & low] = True
    rows = np.flatnonzero(bitmap[heads & low])
    rows = rows[np.isin(heads[rows], repeated)]
    candidates = words[rows]
    order = np.lexsort((rows, candidates[:, 1], candidates[:, 0]))
    ranked = candidates[order]
    again = np.r_[False, (ranked[1:] == ranked[:-1]).all(axis=1)]
    if not again.any():
        return None
    keep = np.ones(len(ids), dtype=bool)
    keep[rows[order][again]] = False
    return keep


def read_source(source: Source, columns: Iterable[str] = ("id", "cohort", "payload"),
                ) -> pa.Table:
    """An Arrow table as given, or the named Parquet file read (one thread: engines run one
    task per core); :class:`ArchiveError` if the file cannot be read."""
    if isinstance(source, pa.Table):
        return source
    try:
        return pq.ParquetFile(source).read(columns=list(columns), use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise ArchiveError(f"cannot read the archive file {os.fspath(source)}: {exc}") from None


def aggregate_bucket(metric: Metric, sources: Iterable[Source]) -> BucketAggregate:
    """Per-cohort statistics of the reports of one (metric, day, bucket), each id once.

    ``sources``: Arrow tables, or paths of Parquet files, with the archive's columns
    (``id``, ``cohort``, ``payload``; see :mod:`~veil.server.archive.layout`), all the
    files of the bucket so that copies of an id in different files are found. Which copy
    of an id is kept does not matter: a replay carries the same report. Raises
    :class:`ArchiveError` for an unreadable file, wrong columns, or a cohort outside
    the metric's ``[0, cohorts)``.
    """
    statistic = statistic_for(metric.params)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for source in sources:
        where = "an Arrow table" if isinstance(source, pa.Table) \
            else f"the archive file {os.fspath(source)}"
        parts.append(from_table(statistic, read_source(source), where))
    result = BucketAggregate.empty(metric)
    if not parts:
        return result
    ids, cohorts, payloads = (np.concatenate([part[i] for part in parts]) if len(parts) > 1
                              else parts[0][i] for i in range(3))
    rows = len(ids)
    keep = first_occurrences(ids)
    if keep is not None:
        cohorts, payloads = cohorts[keep], payloads[keep]
    if len(cohorts) and (cohorts.min() < 0 or cohorts.max() >= metric.params.cohorts):
        raise ArchiveError(f"metric {metric.name!r}: a report of the archive has cohort "
                           f"{int(cohorts.min() if cohorts.min() < 0 else cohorts.max())}, "
                           f"outside [0, {metric.params.cohorts})")
    try:
        accumulated = statistic.accumulate_arrays(metric.params, cohorts, payloads)
    except ValueError as exc:
        raise ArchiveError(f"metric {metric.name!r}: the archive's reports do not fit its "
                           f"parameters: {exc}") from None
    for cohort, count, state in accumulated:
        result.reports[cohort] = count
        result.states[cohort] = state
    result.rows = rows
    result.duplicates = rows - len(cohorts)
    return result

