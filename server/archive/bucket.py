"""The work of one (metric, day, bucket), engine-neutral: Arrow tables or Parquet files in,
per-cohort statistics out.

:func:`aggregate_bucket` reads the files of one bucket, keeps one report of each id
(:func:`first_occurrences`) and accumulates the metric's statistic with NumPy
(:meth:`~veil.shared.statistics.Statistic.accumulate_arrays`), once every row has passed
the wire's own checks (:func:`check_reports`). It imports neither Dask nor any other
engine, so Dask (:func:`veil.server.archive.aggregate`), Spark, Ray or a plain loop can
run it: it is a pure function of its inputs, its result is picklable, and
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
from veil.shared.errors import WireFormatError
from veil.shared.kinds.base import MechanismParams
from veil.shared.registry import Metric
from veil.shared.statistics import State, Statistic, statistic_for

#: log2 of the largest bitmap :func:`first_occurrences` builds (16 MiB)
MAX_BITMAP_BITS = 24
#: integer payloads in ``[0, 2**16)`` find their distinct values by counting, not sorting
COUNTED_INTEGERS = 1 << 16
#: hex digits of a refused bytes payload that an error message shows
SHOWN_HEX = 64
#: the end of an error about a row of the archive that the wire refuses
_REWRITE = ("An archive holds only reports the collector accepted: the file was altered or "
            "not written by veil archive. Write that day again with veil archive --start DAY "
            "--end DAY from the store, or restore the file; nothing was aggregated")
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
    :class:`ArchiveError` for an unreadable file, wrong columns, or a row the wire would
    refuse (:func:`check_reports`), naming the file and the row.
    """
    statistic = statistic_for(metric.params)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for source in sources:
        where = "an Arrow table" if isinstance(source, pa.Table) \
            else f"the archive file {os.fspath(source)}"
        part = from_table(statistic, read_source(source), where)
        check_reports(metric, statistic, part[1], part[2], where)
        parts.append(part)
    result = BucketAggregate.empty(metric)
    if not parts:
        return result
    ids, cohorts, payloads = (np.concatenate([part[i] for part in parts]) if len(parts) > 1
                              else parts[0][i] for i in range(3))
    rows = len(ids)
    keep = first_occurrences(ids)
    if keep is not None:
        cohorts, payloads = cohorts[keep], payloads[keep]
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



def check_reports(metric: Metric, statistic: Statistic, cohorts: np.ndarray,
                  payloads: np.ndarray, where: str) -> None:
    """Refuse the reports of one file unless the wire would accept every row: its cohort in
    the metric's ``[0, cohorts)`` and its payload through the metric's own
    :meth:`~veil.shared.kinds.base.MechanismParams.parse_payload`, the check the collector
    applies to each report it receives. An archive holds only reports a collector accepted,
    so a refused row means a file altered or not written by ``veil archive``: counting it
    would let one row move a whole day's statistic (a boolean's ``ones`` of 10**12, a
    number's sum of 1e300 or NaN).

    Raises :class:`ArchiveError` naming ``where`` (the file), the first refused row
    (counting from 0), the column, the value and the wire's reason.
    """
    if not len(cohorts):
        return
    params = metric.params
    if cohorts.min() < 0 or cohorts.max() >= params.cohorts:
        row = int(np.argmax((cohorts < 0) | (cohorts >= params.cohorts)))
        raise ArchiveError(f"{where}, row {row} (counting from 0): cohort "
                           f"{int(cohorts[row])}, outside [0, {params.cohorts}), the cohorts of "
                           f"metric {metric.name!r}. {_REWRITE}")
    payload_type = statistic.payload_type
    refused = (_refused_bytes(params, payloads) if payload_type == "bytes"
               else _refused_values(params, payload_type, payloads))
    if refused is None:
        return
    row, error = refused
    raise ArchiveError(f"{where}, row {row} (counting from 0): the wire refuses its payload "
                       f"{_shown(payload_type, payloads[row])} for metric {metric.name!r} "
                       f"({error.code}): {error}. {_REWRITE}")



def _wire_payload(payload_type: str, stored: np.ndarray) -> object:
    """One stored payload (an element of the array :func:`from_table` gives) as the wire
    carries it: the hex of its bytes, or the JSON integer or number."""
    if payload_type == "bytes":
        return np.ascontiguousarray(stored, dtype=np.uint8).tobytes().hex()
    return stored.item()


def _parse_error(params: MechanismParams, payload: object) -> WireFormatError | None:
    """Why the wire refuses ``payload``, or ``None`` if it accepts it."""
    try:
        params.parse_payload(payload)
    except WireFormatError as exc:
        return exc
    return None


def _first_refused(params: MechanismParams, payload_type: str, payloads: np.ndarray,
                   rows: np.ndarray) -> tuple[int, WireFormatError] | None:
    """The first of ``rows`` whose payload the wire refuses, and why."""
    for row in rows.tolist():
        error = _parse_error(params, _wire_payload(payload_type, payloads[row]))
        if error is not None:
            return row, error
    return None


def _refused_values(params: MechanismParams, payload_type: str, payloads: np.ndarray,
                    ) -> tuple[int, WireFormatError] | None:
    """The first row of an integer or float column the wire refuses, and why.

    The wire's check runs once per distinct value, not per row: a boolean or an oracle has
    a handful of values, a number one per grid point its noise reached. Integers in
    ``[0, 2**16)`` are found by counting; others, and floats, by sorting (NaNs fold into one).
    """
    values = np.asarray(payloads)
    if values.dtype.kind in "iu" and values.min() >= 0 and values.max() < COUNTED_INTEGERS:
        distinct = np.flatnonzero(np.bincount(values))
    else:
        distinct = np.unique(values)
    bad = [value for value in distinct if _parse_error(params, value.item()) is not None]
    if not bad:
        return None
    refused = np.isin(values, bad)
    if values.dtype.kind == "f" and any(np.isnan(value) for value in bad):
        refused |= np.isnan(values)
    return _first_refused(params, payload_type, values, np.flatnonzero(refused)[:1])


def _refused_bytes(params: MechanismParams, payloads: np.ndarray,
                   ) -> tuple[int, WireFormatError] | None:
    """The first row of a fixed-width bytes column the wire refuses, and why.

    Every wire rule for bytes payloads is about which bits a payload sets (pad bits beyond
    ``k``, a discovery row's bits beyond its domain, a bucket beyond ``2**t - 1``), besides
    its length. So the check runs on the all-zero payload of the column's width (its
    length) and on each bit that some row sets, alone: at most 8 checks a byte, whatever
    the rows. A row setting a refused bit is then checked whole, which gives the wire's
    message; should it pass, every row is checked one by one.
    """
    raw = np.ascontiguousarray(payloads, dtype=np.uint8)
    count, width = raw.shape
    zero = np.zeros(width, dtype=np.uint8)
    if _parse_error(params, zero.tobytes().hex()) is not None:
        return _first_refused(params, "bytes", raw, np.arange(count))
    seen = _bits_set(raw)
    refused_bits = np.zeros(width, dtype=np.uint8)
    for position in np.flatnonzero(seen).tolist():
        for bit in range(8):
            mask = 1 << bit
            if seen[position] & mask:
                probe = zero.copy()
                probe[position] = mask
                if _parse_error(params, probe.tobytes().hex()) is not None:
                    refused_bits[position] |= mask
    if not refused_bits.any():
        return None
    rows = np.flatnonzero((raw & refused_bits).any(axis=1))
    return (_first_refused(params, "bytes", raw, rows[:1])
            or _first_refused(params, "bytes", raw, np.arange(count)))


def _bits_set(raw: np.ndarray) -> np.ndarray:
    """The bitwise OR of the rows of an ``(n, width)`` uint8 array: the bits some row sets.
    One reduction per column of the widest integers the width allows (a reduction along
    the rows of the whole array is 20 times slower)."""
    size = next(size for size in (8, 4, 2, 1) if raw.shape[1] % size == 0)
    wide = raw.view(f"<u{size}")
    return np.array([np.bitwise_or.reduce(wide[:, column]) for column in range(wide.shape[1])],
                    dtype=f"<u{size}").view(np.uint8)


def _shown(payload_type: str, payload: np.ndarray) -> str:
    """A payload of the archive as an error message shows it."""
    wire = _wire_payload(payload_type, payload)
    if isinstance(wire, str):
        return wire if len(wire) <= SHOWN_HEX else f"{wire[:SHOWN_HEX]}... ({len(wire)} hex digits)"
    return repr(wire)
